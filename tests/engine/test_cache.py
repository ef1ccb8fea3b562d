"""Engine core: radix cache with checkpoints, eviction, batching invariance, no leaks, validation."""

import pytest

from engine.config import EngineConfig
from tests.engine.sessions import first_divergence, make_engine, margin, prompt, req, two_turn


@pytest.mark.parametrize("interval", [64, 128, 256])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_two_turn_restores_checkpoint_and_matches_cold(interval, offset):
    warm = make_engine(mamba_track_interval=interval)
    cold = make_engine(disable_radix_cache=True)
    ids = prompt(interval + offset, seed=interval + offset)
    n1 = 24
    o1, ids2, o2 = two_turn(warm, ids, n1, 16, "s")
    committed = len(ids) + n1 - 1  # the last output token never ran through the model
    assert o2.cached_tokens == committed // interval * interval
    ref = cold.generate([req("c", ids2, 16)])[0]
    assert ref.cached_tokens == 0
    assert o2.output_ids == ref.output_ids
    assert max(abs(a - b) for a, b in zip(o2.output_logprobs, ref.output_logprobs, strict=True)) <= 1e-4


def test_no_buffer_strategy_inserts_full_length():
    warm = make_engine(mamba_radix_cache_strategy="no_buffer", page_size=1, mamba_track_interval=64)
    cold = make_engine(disable_radix_cache=True)
    ids = prompt(100, seed=3)
    o1, ids2, o2 = two_turn(warm, ids, 10, 12, "nb")
    assert o2.cached_tokens == len(ids) + 10 - 1
    assert o2.output_ids == cold.generate([req("c", ids2, 12)])[0].output_ids


def test_eviction_keeps_outputs_identical():
    # room for ~2 requests' KV: inserting later sessions must evict earlier ones
    small = make_engine(mamba_track_interval=64, max_total_tokens=16 * 40, max_running_requests=2,
                        max_state_slots=8)
    cold = make_engine(disable_radix_cache=True)
    for s in range(4):
        ids = prompt(200 + s, seed=100 + s)
        o1, ids2, o2 = two_turn(small, ids, 12, 8, f"e{s}")
        assert o2.output_ids == cold.generate([req("c1", ids2, 8)])[0].output_ids
        assert o1.output_ids == cold.generate([req("c0", ids, 12)])[0].output_ids
    st = small.stats()
    assert st["kv_evicted_pages"] > 0
    assert st["checkpoint_evictions"] > 0


def test_concurrent_equals_sequential():
    reqs = [req(f"r{i}", prompt(60 + 13 * i, seed=i), 20) for i in range(16)]
    together = make_engine(disable_radix_cache=True).generate(reqs)
    solo = make_engine(disable_radix_cache=True)  # without a cache, one request at a time is independent
    alone = [solo.generate([r])[0] for r in reqs]
    for a, b in zip(together, alone, strict=True):
        d = first_divergence(a.output_ids, b.output_ids)
        if d is not None:
            m = margin(b, d)
            print(f"{a.rid}: differs at {d}, top-1/top-2 margin {m:.2e}")
            assert m < 1e-3


def _assert_baseline(engine):
    st = engine.stats()
    assert st["running"] == 0 and st["waiting"] == 0
    assert st["kv_pages_used"] == st["radix_pages"]
    assert st["state_slots_used"] == st["radix_checkpoints"]
    assert engine.flush_cache()
    st = engine.stats()
    assert st["kv_pages_used"] == 0 and st["state_slots_used"] == 0


@pytest.mark.parametrize("spec", ["NONE", "DFLASH"])
def test_no_leak_with_aborts(spec):
    e = make_engine(mamba_track_interval=64, speculative_algorithm=spec, max_running_requests=4)
    for i in range(8):
        e.submit(req(f"r{i}", prompt(70 + 20 * i, seed=i), 30))
    steps = 0
    while e.has_work:
        e.step()
        steps += 1
        if steps == 3:
            assert e.abort("r0") and e.abort("r5")  # one running, one still waiting
        if steps == 6:
            e.abort("r2")
    _assert_baseline(e)
    assert e.stats()["aborted"] == 3


def test_pool_full_waits_and_impossible_request_errors():
    e = make_engine(max_total_tokens=16 * 12, disable_radix_cache=True)
    # each needs ceil((60 + 40 + 1) / 16) = 7 pages: only one fits at a time, the other waits
    outs = e.generate([req("a", prompt(60, 1), 40), req("b", prompt(60, 2), 40)])
    assert [len(o.output_ids) for o in outs] == [40, 40]
    with pytest.raises(ValueError, match="KV pages"):
        e.submit(req("c", prompt(300, 3), 10))
    with pytest.raises(ValueError, match="context length"):
        e.submit(req("d", prompt(2000, 3), 100))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        e.submit(req("e", (1, 2, 999), 10))


@pytest.mark.parametrize("kw,msg", [
    (dict(mamba_track_interval=100, page_size=16), "multiple of page_size"),
    (dict(mamba_track_interval=4, page_size=4, speculative_algorithm="DFLASH", speculative_num_draft_tokens=8),
     "must be >= speculative_num_draft_tokens"),
    (dict(mamba_radix_cache_strategy="no_buffer", page_size=16), "requires page_size 1"),
    (dict(mamba_track_interval=16, speculative_algorithm="DFLASH", speculative_num_draft_tokens=16),
     "must be >= 2 x 16 tokens per step with overlap scheduling"),
    (dict(chunked_prefill_size=32), "chunked_prefill_size .32. must be >= the mamba cache chunk size"),
    (dict(mamba_ssm_dtype="float16"), "mamba_ssm_dtype must be one of"),
    (dict(inject_fault="nope"), "valid faults: conv-not-tracked"),
    (dict(speculative_algorithm="EAGLE"), "speculative_algorithm must be one of"),
])
def test_validation_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        EngineConfig(**kw)
