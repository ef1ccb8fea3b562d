"""Where the engine checkpoints (SGLang's rules, docs/engine.md), and that every resume equals the cold path.

Positions: prefill checkpoints on the mamba chunk grid, inserted while the request
still runs; decode/verify ones at interval multiples. Equality: two-turn sessions
and concurrent shared-prefix requests around 64-aligned and interval-aligned
lengths, overlap on and off, fp32 and bf16 states, concurrency 1 and 8.
"""

import pytest
import torch

from tests.engine.sessions import SUFFIX, make_engine, prompt, req


def checkpoint_depths(engine) -> set[int]:
    """Prefix lengths that hold a checkpoint in the engine's radix tree."""
    return {n.depth for n in engine.sched.radix._nodes() if n.checkpoint is not None}


def run_until(engine, cond, limit=500):
    for _ in range(limit):
        if cond():
            return
        engine.step()
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("plen, chunked, expected", [
    (1000, 1024, {960}),  # one extend: the deepest 64-aligned position, not 256/512/768
    (1000, 512, {512, 960}),  # two extends [0, 512) and [512, 1000)
    (100, 512, {64}),
    (63, 512, set()),  # shorter than a chunk: no prefill checkpoint
    (256, 512, {256}),  # on the grid: the extend's final state
])
def test_prefill_checkpoints_enter_the_tree_while_the_request_runs(plen, chunked, expected):
    e = make_engine(mamba_track_interval=256, chunked_prefill_size=chunked)
    e.submit(req("a", prompt(plen, seed=plen), 40))
    run_until(e, lambda: e.sched.running and len(e.sched.running[0].out.output_ids) >= 2)
    r = e.sched.running[0]
    assert not r.out.finished
    assert checkpoint_depths(e) == expected
    while e.has_work:
        e.step()


@pytest.mark.parametrize("spec", ["NONE", "DFLASH"])
def test_decode_and_verify_checkpoints_sit_at_interval_multiples(spec):
    e = make_engine(mamba_track_interval=64, speculative_algorithm=spec, speculative_num_draft_tokens=8,
                    drafter_mode="scripted", scripted_accept=-1)
    o = e.generate([req("a", prompt(100, seed=3), 100)])[0]
    # prefill at 64; decode/verify: only the last boundary crossed is inserted at finish (192)
    assert checkpoint_depths(e) == {64, 192}
    for pre, c, step in o.spec_trace:
        crossed = pre // 64 != (pre + c) // 64
        assert (step >= 0) == crossed and (not crossed or pre + step + 1 == (pre + c) // 64 * 64)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("spec", ["NONE", "DFLASH"])
def test_a_running_requests_prefill_checkpoint_is_hit_by_a_concurrent_request(spec, overlap):
    kw = dict(mamba_track_interval=128, speculative_algorithm=spec, disable_overlap_schedule=not overlap)
    e, cold = make_engine(**kw), make_engine(**kw, disable_radix_cache=True)
    shared = list(prompt(700, seed=7))  # prefilled as [0, 512) and [512, 700): checkpoints 512 and 640
    a = req("a", shared, 60)
    b = req("b", shared[:690] + list(prompt(60, seed=8)), 20)
    e.submit(a)
    run_until(e, lambda: 640 in checkpoint_depths(e))
    ra = e.sched.running[0]
    assert not ra.out.finished and len(ra.out.output_ids) < 60  # a is still decoding
    e.submit(b)
    outs = {}
    while e.has_work:
        for o in e.step():
            if o.finished:
                outs[o.rid] = o
    assert outs["b"].cached_tokens == 640
    for q in (a, b):
        ref = cold.generate([q])[0]
        assert outs[q.rid].output_ids == ref.output_ids
        assert max(abs(x - y) for x, y in zip(outs[q.rid].output_logprobs, ref.output_logprobs, strict=True)) <= 1e-3


def test_a_branching_point_is_checkpointed_instead_of_the_aligned_end():
    """SGLang's mamba_branching_seqlen: KV matched past the deepest checkpoint gets one of its own."""
    e = make_engine(mamba_track_interval=256)
    base = list(prompt(1000, seed=11))
    e.generate([req("a", base, 4)])  # prefill checkpoints 512 and 960
    b = base[:700] + list(prompt(300, seed=12))  # shares 700 tokens: resumes at 512, KV matches to 688
    o = e.generate([req("b", b, 4)])[0]
    assert o.cached_tokens == 512
    assert 640 in checkpoint_depths(e)  # b's extend [512, 1000) checkpointed the branch point, not 960
    c = e.generate([req("c", base[:650] + [1, 2, 3] * 40, 4)])[0]
    assert c.cached_tokens == 640


def test_overlapped_extra_step_of_a_finished_request_leaves_its_checkpoint_intact():
    """Finishing right before a boundary: the overlapped extra step writes the other ping-pong slot."""
    e = make_engine(mamba_track_interval=64)
    cold = make_engine(disable_radix_cache=True)
    ids = prompt(100, seed=5)
    # committed 100 + 92 - 1 = 191 at finish; the extra step reaches 192, a boundary; 128 was the last recorded
    o1 = e.generate([req("t1", ids, 92)])[0]
    assert checkpoint_depths(e) == {64, 128}
    ids2 = tuple(ids) + tuple(o1.output_ids) + SUFFIX
    o2 = e.generate([req("t2", ids2, 16)])[0]
    assert o2.cached_tokens == 128
    assert o2.output_ids == cold.generate([req("c", ids2, 16)])[0].output_ids


LENGTHS = [63, 64, 65, 127, 128, 129, 191, 255, 256, 257, 1000]  # around 64-aligned and interval (128) multiples


def _matrix_case(overlap: bool, dtype: str, conc: int, spec: str) -> float:
    """Two-turn sessions + a concurrent sibling of each turn 2; returns the worst |logprob diff| vs cold."""
    kw = dict(mamba_track_interval=128, mamba_ssm_dtype=dtype, disable_overlap_schedule=not overlap,
              speculative_algorithm=spec, drafter_mode="scripted", scripted_accept=-1)
    cand, cold = make_engine(**kw), make_engine(**kw, disable_radix_cache=True)
    worst, hits = 0.0, 0
    for group in [LENGTHS[i : i + conc] for i in range(0, len(LENGTHS), conc)]:
        ids1 = [prompt(n, seed=n) for n in group]
        o1 = cand.generate([req(f"t1-{n}", ids, 12) for n, ids in zip(group, ids1, strict=True)])
        ids2 = [tuple(a) + tuple(o.output_ids) + SUFFIX for a, o in zip(ids1, o1, strict=True)]
        sibs = [x[:-3] + (7, 8, 9) for x in ids2]  # shares the checkpoint turn 2 resumes from
        o2 = cand.generate([req(f"t2-{i}", x, 8) for i, x in enumerate(ids2 + sibs)])
        refs = cold.generate([req(f"c1-{n}", ids, 12) for n, ids in zip(group, ids1, strict=True)]
                             + [req(f"c2-{i}", x, 8) for i, x in enumerate(ids2 + sibs)])
        for o, ref in zip(o1 + o2, refs, strict=True):
            assert o.output_ids == ref.output_ids, (o.rid, o.cached_tokens)
            worst = max(worst, *(abs(a - b) for a, b in zip(o.output_logprobs, ref.output_logprobs, strict=True)))
            hits += o.cached_tokens > 0
    # every turn 2 and its sibling resumed, but the 63-token session's (no prefill checkpoint, no boundary crossed)
    assert hits == 2 * len(LENGTHS) - 2
    return worst


@pytest.mark.parametrize("conc", [1, 8])
@pytest.mark.parametrize("overlap", [True, False])
def test_cached_equals_cold_fp32(overlap, conc):
    assert _matrix_case(overlap, "float32", conc, "NONE") <= 1e-3


@pytest.mark.parametrize("conc", [1, 8])
def test_cached_equals_cold_fp32_speculative(conc):
    assert _matrix_case(True, "float32", conc, "DFLASH") <= 1e-3


@pytest.mark.parametrize("conc", [1, 8])
@pytest.mark.parametrize("overlap", [True, False])
def test_cached_equals_cold_bf16_states(overlap, conc):
    """bf16 states: same tokens; the log-prob drift is rounding at the restored checkpoint (PR #33515)."""
    worst = _matrix_case(overlap, "bfloat16", conc, "NONE")
    assert 1e-3 < worst < 0.5  # measurably beyond fp32's noise, below the oracle's margin threshold


def test_mamba_ssm_dtype_sets_the_stored_state_dtype():
    e = make_engine(mamba_ssm_dtype="bfloat16", speculative_algorithm="DFLASH")
    st = e.runner.caches.state
    assert st.rec.dtype == torch.bfloat16 and st.conv.dtype == torch.float32  # conv windows hold raw inputs
    fb = e.runner._fb([0], 8, [[0]], [0], verify=True)
    assert fb.rec_inter.dtype == torch.bfloat16 and fb.conv_inter.dtype == torch.float32
    assert make_engine().runner.caches.state.rec.dtype == torch.float32


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_processes_a_steps_result_one_step_late(overlap):
    e = make_engine(disable_overlap_schedule=not overlap, mamba_track_interval=64)
    e.submit(req("a", prompt(40, seed=1), 3))
    seen = [len(e.step()) for _ in range(2)]  # step 1 runs the prefill; its token is seen at once or a step late
    assert seen == ([0, 1] if overlap else [1, 1])
    r = e.sched.running[0]
    while e.has_work:
        e.step()
    assert r.out.output_ids == list(r.generated) and len(r.out.output_ids) == 3
    # a finished request runs one more (discarded) step under overlap: its device view is a step ahead
    assert r.seq_len == 40 + 3 - 1 + (1 if overlap else 0)


def test_decode_batch_filter_and_merge_keep_tracking_slots_aligned():
    from engine.req import Req
    from engine.schedule_batch import DecodeBatch

    reqs = [Req(req=req(f"r{i}", (1,), 1), out=None, track_slots=[10 * i, 10 * i + 1]) for i in range(4)]
    reqs[1].next_track_idx = 1
    b = DecodeBatch()
    assert b.merge(reqs[:3]) and b.track_slots is None  # rows changed: the indices are stale until rebuilt
    b.prepare_track()
    assert b.track_slots == [0, 11, 20]
    assert b.filter(lambda r: r is not reqs[1]) and b.track_slots is None
    assert b.merge([reqs[3]])
    reqs[0].next_track_idx = 1  # a checkpoint was recorded since: the row must follow the flip
    b.prepare_track()
    assert [r.rid for r in b.reqs] == ["r0", "r2", "r3"] and b.track_slots == [1, 20, 30]
    assert not b.filter(lambda r: True) and not b.merge([])
