"""Deterministic mode (--enable-deterministic-inference, engine/deterministic.py), in fp32 and bf16.

Property tests over seeded random models (the tiny preset's random weights, one seed per case) and seeded
random workloads: a request's output ids, log-probs and top log-probs (compared as exact float bits) do not
depend on (a) what else is in its batch and in which order it came, (b) whether its positions were drafted and
verified or decoded one at a time, (c) whether its prefix was restored from a checkpoint or prefilled cold; and
the states themselves do not depend on where a scan was cut. The default mode is shown not to be batch
invariant in bf16 on one of these workloads, so the batch test is not one that cannot fail.
"""

from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from engine.server.config import build_parser, configs_from_args, to_argv
from tests.engine.sessions import SUFFIX, make_engine, req

DTYPES = ["float32", "bfloat16"]


def det_engine(dtype: str, seed: int, **kw):
    return make_engine(dtype=dtype, seed=seed, enable_deterministic_inference=True, **kw)


def bits(o) -> tuple:
    """What must be bit-identical: ids, log-probs and top log-probs as exact hex floats."""
    return (o.output_ids, [x.hex() for x in o.output_logprobs],
            [[(lp.hex(), i) for lp, i in top] for top in o.output_top_logprobs])


def random_request(rng: random.Random, rid: str, sampled: bool = True):
    ids = [rng.randrange(256) for _ in range(rng.randrange(1, 180))]
    sp = {"temperature": 0.8, "seed": rng.randrange(1 << 30)} if sampled and rng.random() < 0.25 else {}
    return req(rid, ids, rng.randrange(1, 20), top=rng.choice([0, 2, 5]), **sp)


def test_flag_parses_round_trips_and_is_reported():
    parser = build_parser()
    cfg, _ = configs_from_args(parser.parse_args(["--enable-deterministic-inference"]), parser)
    assert cfg == EngineConfig(enable_deterministic_inference=True)
    assert to_argv(cfg) == ["--enable-deterministic-inference"]
    assert EngineConfig().enable_deterministic_inference is False
    assert det_engine("float32", 0).server_info()["enable_deterministic_inference"] is True
    assert make_engine().server_info()["enable_deterministic_inference"] is False


def _alone_and_batched(dtype: str, seed: int, others: int, deterministic: bool, **kw):
    rng = random.Random(seed)
    main = random_request(rng, "main")
    batch = [main] + [random_request(rng, f"o{i}") for i in range(others)]
    rng.shuffle(batch)
    mk = det_engine if deterministic else (lambda d, s, **k: make_engine(dtype=d, seed=s, **k))
    alone = mk(dtype, seed, **kw).generate([main])[0]
    # a short prefill budget cuts the prompts into chunks wherever the others' lengths put the cuts
    together = mk(dtype, seed, chunked_prefill_size=64, **kw).generate(batch)
    return alone, next(o for o in together if o.rid == "main")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed,others,spec", [(1, 1, "NONE"), (2, 6, "NONE"), (3, 15, "NONE"), (4, 15, "DFLASH")])
def test_batch_invariance(dtype, seed, others, spec):
    """(a) The same request alone and batched with 1..15 other random requests, in a random order: the same bits."""
    kw = {"speculative_algorithm": spec, "drafter_mode": "scripted", "scripted_accept": -1,
          "mamba_track_interval": 64}
    alone, batched = _alone_and_batched(dtype, seed, others, True, **kw)
    assert bits(batched) == bits(alone)


def test_default_bf16_is_not_batch_invariant():
    """Without the mode, the same bf16 request moves with its batch (this workload: log-prob bits differ)."""
    alone, batched = _alone_and_batched("bfloat16", 3, 15, False)
    assert alone.output_ids == batched.output_ids
    assert [x.hex() for x in alone.output_logprobs] != [x.hex() for x in batched.output_logprobs]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [4, 8])
def test_speculation_invariance(dtype, block):
    """(b) DFlash (drafts accepted 0..B-1 per verify step, cycling) gives the bits of plain decoding, batched."""
    rng = random.Random(10 + block)
    reqs = [random_request(rng, f"r{i}", sampled=False) for i in range(5)]
    reqs = [req(q.rid, q.input_ids, 24, top=2) for q in reqs]  # long enough for several verify steps each
    plain = det_engine(dtype, block).generate(reqs)
    spec = det_engine(dtype, block, speculative_algorithm="DFLASH", speculative_num_draft_tokens=block,
                      drafter_mode="scripted", scripted_accept=-1).generate(reqs)
    assert [bits(o) for o in spec] == [bits(o) for o in plain]
    assert max(c for o in spec for _, c, _ in o.spec_trace) >= 4  # verify steps committed several tokens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", ["NONE", "DFLASH"])
def test_restore_invariance(dtype, spec):
    """(c) Follow-up turns that restore checkpoints (prefill, decode or verify ones) give the bits of the same
    prompts prefilled cold with the radix cache off."""
    rng = random.Random(20)
    firsts = [[rng.randrange(256) for _ in range(rng.randrange(50, 140))] for _ in range(4)]
    kw = {"speculative_algorithm": spec, "drafter_mode": "scripted", "scripted_accept": -1,
          "mamba_track_interval": 64}
    e = det_engine(dtype, 7, **kw)
    o1 = e.generate([req(f"s{i}-1", ids, 30) for i, ids in enumerate(firsts)])
    seconds = [list(a) + list(o.output_ids) + list(SUFFIX) for a, o in zip(firsts, o1, strict=True)]
    o2 = e.generate([req(f"s{i}-2", ids, 12) for i, ids in enumerate(seconds)])
    assert all(o.cached_tokens > 0 for o in o2)  # every follow-up resumed from a checkpoint
    cold = det_engine(dtype, 7, disable_radix_cache=True)
    assert [bits(o) for o in o2] == [bits(cold.generate([req(f"c{i}", ids, 12)])[0])
                                     for i, ids in enumerate(seconds)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_states_do_not_depend_on_where_the_scan_was_cut(dtype):
    """The state after a scan resumed from a checkpoint is the cold scan's state there, bit for bit; so are a
    prefill checkpoint, the states of a token-by-token decode and a verify's intermediate steps."""
    e = det_engine(dtype, 3, disable_radix_cache=True)
    r, st = e.runner, e.runner.caches.state
    ids, pages = [random.Random(4).randrange(256) for _ in range(100)], list(range(7))

    def state(slot):
        return st.rec[:, slot].clone(), st.conv[:, slot].clone()

    def same(a, b):
        return all(x.dtype == y.dtype and x.equal(y) for x, y in zip(a, b, strict=True))

    r.zero_states([0, 1, 2, 3])
    cold_logits = r.extend(ids, 0, pages, 0, track_slot=1, track_offset=64)  # one extend, a checkpoint at 64
    cold_end, at64 = state(0), state(1)
    r.extend(ids[:64], 0, pages, 2)
    assert same(state(2), at64)
    resumed = r.extend(ids[64:], 64, pages, 2)  # resumed from the checkpoint
    assert same(state(2), cold_end) and resumed.equal(cold_logits)
    r.extend(ids[:91], 0, pages, 3)
    for p in range(91, 100):
        step = r.decode([ids[p]], [p], [pages], [3])[0]
    assert same(state(3), cold_end) and step.equal(cold_logits)
    r.zero_states([3])
    r.extend(ids[:92], 0, pages, 3)
    logits = r.verify([ids[92:]], [92], [pages], [3])
    fb, _ = r._last_verify
    assert same((fb.rec_inter[:, 0, -1], fb.conv_inter[:, 0, -1]), cold_end) and logits[0, -1].equal(cold_logits)


def test_every_token_of_a_step_is_a_sign_of_life_to_the_server():
    """A deterministic step is a forward per token (a long prompt's prefill: many seconds on a busy CPU): each
    token beats the server's heartbeat, so that the watchdog never takes a step that is making progress for a
    stalled engine loop."""
    from engine.server.async_engine import AsyncEngine

    engine = det_engine("float32", 0)
    beats = []
    engine.runner.token_by_token.progress = lambda: beats.append(1)
    engine.generate([req("long", list(range(1, 101)), 3)])
    assert len(beats) >= 100 + 2  # the prompt's tokens, then a decode step per output but the first
    served = AsyncEngine(engine.cfg, engine=engine)
    try:
        assert engine.runner.token_by_token.progress == served.heartbeat.beat
    finally:
        served.shutdown()
    assert make_engine().runner.token_by_token is None  # the default mode has no per-token hook
