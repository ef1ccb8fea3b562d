"""Each injected fault changes behaviour; stale-seq-lens (#37817) poisons exactly the verify-crossed checkpoints."""

import functools

import pytest

from engine.faults import FAULTS
from protocol.tokenizer import BYTE_TOKENIZER
from tests.engine.sessions import SUFFIX, make_engine, prompt, req
from workloads.tree import tree_sessions

B, I = 8, 128


def _sessions():
    # turn-1 prompts just below a boundary: decoding crosses it inside a verify step
    return [prompt(I + off, seed=700 + off) for off in (-7, -5, -3, -1)] + [prompt(2 * I - 4, seed=1)]


def _run(fault):
    # the `small` preset: its linear layers remember long enough, and its logits are peaked enough,
    # that a wrong restored state shows up as changed tokens (the tiny preset forgets within ~30 tokens)
    cand = make_engine(model_preset="small", speculative_algorithm="DFLASH", speculative_num_draft_tokens=B,
                       mamba_track_interval=I, inject_fault=fault)
    results = []
    for i, ids in enumerate(_sessions()):
        o1 = cand.generate([req(f"f{i}-1", ids, 24)])[0]
        ids2 = tuple(ids) + tuple(o1.output_ids) + SUFFIX
        o2 = cand.generate([req(f"f{i}-2", ids2, 16)])[0]
        ref = _cold_small(ids2, 16)
        verify_crossed = {(p + c) // I * I for p, c, _ in o1.spec_trace if p // I != (p + c) // I}
        results.append((o1, o2, ref, verify_crossed))
    return results


def test_clean_engine_never_diverges():
    for _o1, o2, ref, crossed in _run(None):
        assert o2.cached_tokens in crossed
        assert o2.output_ids == ref.output_ids


def test_stale_seq_lens_restores_stale_checkpoint_and_diverges():
    for o1, o2, ref, crossed in _run("stale-seq-lens"):
        # the scheduler still recorded the boundary, so turn 2 resumes there ...
        assert o2.cached_tokens in crossed
        # ... the worker never copied the state (tracked step -1 on the crossing step) ...
        assert all(s == -1 for _, _, s in o1.spec_trace)
        # ... and the output silently differs from the cold path
        assert o2.output_ids != ref.output_ids


@pytest.mark.parametrize("fault", ["track-off-by-one", "conv-not-tracked", "insert-working-state"])
def test_other_faults_change_behaviour(fault):
    diverged = sum(o2.output_ids != ref.output_ids for _, o2, ref, _ in _run(fault))
    assert diverged >= 1


def test_registry_documents_every_fault():
    assert "stale-seq-lens" in FAULTS and len(FAULTS) == 11
    for f in FAULTS.values():
        assert len(f.doc) > 200 and f.summary


# --- the faults SGLang's prefill checkpoints, unfinished-request caching and overlap make reachable ----------

def _cold_small(ids, n):
    """The cold path's output for (ids, n) on the small preset (shared by the fault tests below)."""
    key = (tuple(ids), n)
    if key not in _COLD:
        _COLD[key] = _cold_engine().generate([req("cold", ids, n)])[0]
    return _COLD[key]


_COLD: dict = {}


@functools.cache
def _cold_engine():
    return make_engine(model_preset="small", disable_radix_cache=True)


def _two_turns(engine, ids, n1=24, n2=16, tail=None):
    """Turn 1, then turn 2 = turn 1 + its output + SUFFIX (or `tail(turn-1 prompt)`); outputs and turn-2 prompt."""
    o1 = engine.generate([req("t1", ids, n1)])[0]
    ids2 = tail(ids) if tail else tuple(ids) + tuple(o1.output_ids) + SUFFIX
    o2 = engine.generate([req("t2", ids2, n2)])[0]
    return o1, o2, ids2


@pytest.mark.parametrize("fault", [None, "prefill-checkpoint-off-boundary"])
def test_prefill_checkpoint_off_boundary_poisons_the_prefill_checkpoint(fault):
    """Boundary kind: prefill checkpoint. Turn 2 resumes at 960, a prefill position (not a multiple of I)."""
    e = make_engine(model_preset="small", mamba_track_interval=256, inject_fault=fault)
    base = prompt(1000, seed=31)  # extends [0, 512) and [512, 1000): checkpoints 512 (its end) and 960 (inside)
    o1, o2, ids2 = _two_turns(e, base, n1=4, tail=lambda ids: tuple(ids[:980]) + tuple(prompt(40, seed=32)))
    assert o2.cached_tokens == 960
    assert (o2.output_ids != _cold_small(ids2, 16).output_ids) == (fault is not None)
    assert o1.output_ids == _cold_small(base, 4).output_ids  # the turn that took the checkpoint is fine


@pytest.mark.parametrize("fault", [None, "pingpong-double-flip"])
def test_pingpong_double_flip_inserts_the_other_slot(fault):
    """Boundary kind: decode checkpoint. 120-token prompt: prefill checkpoint 64, decode crosses 128."""
    e = make_engine(model_preset="small", mamba_track_interval=128, inject_fault=fault)
    o1, o2, ids2 = _two_turns(e, prompt(120, seed=33))
    assert o2.cached_tokens == 128
    assert (o2.output_ids != _cold_small(ids2, 16).output_ids) == (fault is not None)


@pytest.mark.parametrize("fault", [None, "evict-matched-checkpoint"])
def test_evict_matched_checkpoint_restores_an_evicted_slot(fault):
    """Boundary kind: restore. A tight state pool: 2 requests x 3 slots; one running, one checkpoint cached."""
    e = make_engine(model_preset="small", mamba_track_interval=64, max_running_requests=2, max_state_slots=6,
                    inject_fault=fault)
    a = prompt(60, seed=34)  # no prefill checkpoint (< 64 tokens); decoding crosses 64
    o1 = e.generate([req("a1", a, 20)])[0]
    e.submit(req("x", prompt(40, seed=35), 60))  # holds 3 slots while a's second turn arrives
    while not (e.sched.running and e.sched.running[0].out.output_ids):
        e.step()
    ids2 = tuple(a) + tuple(o1.output_ids) + SUFFIX
    e.submit(req("a2", ids2, 16))
    outs = {}
    while e.has_work:
        outs.update({o.rid: o for o in e.step() if o.finished})
    assert outs["a2"].cached_tokens == 64
    assert (outs["a2"].output_ids != _cold_small(ids2, 16).output_ids) == (fault is not None)
    assert e.stats()["checkpoint_evictions"] == (1 if fault else 0)


@pytest.mark.parametrize("fault", [None, "conv-rollback-wrong-step"])
def test_conv_rollback_wrong_step_changes_the_same_turn(fault):
    """Boundary kind: verify working state. No cache at all: the request itself diverges on partial acceptance."""
    e = make_engine(model_preset="small", speculative_algorithm="DFLASH", disable_radix_cache=True,
                    inject_fault=fault)
    ids = prompt(90, seed=36)
    o = e.generate([req("a", ids, 32)])[0]
    assert any(c < 8 for _, c, _ in o.spec_trace)  # partial acceptance happened
    assert (o.output_ids != _cold_small(ids, 32).output_ids) == (fault is not None)


@pytest.mark.parametrize("plen, exposed", [(127, True), (100, False)])
@pytest.mark.parametrize("fault", [None, "track-dropped-on-batch-change"])
def test_track_dropped_on_batch_change_loses_the_crossing_after_a_join(fault, plen, exposed):
    """Boundary kind: verify checkpoint. A 127-token prompt crosses 128 in its first verify, the step right after
    it joined the running batch; a 100-token one crosses later, in an unchanged batch, and is not hit."""
    e = make_engine(model_preset="small", speculative_algorithm="DFLASH", mamba_track_interval=128,
                    inject_fault=fault)
    o1, o2, ids2 = _two_turns(e, prompt(plen, seed=37), n1=40)
    assert o2.cached_tokens == 128
    first_crossing = next(i for i, (p, c, _) in enumerate(o1.spec_trace) if p // 128 != (p + c) // 128)
    assert (first_crossing == 0) == exposed
    assert (o2.output_ids != _cold_small(ids2, 16).output_ids) == (fault is not None and exposed)


def _fan_turns(fault):
    """The frozen suite's `fan` session at I = 128 (workloads/tree.py) with random text: turn 0 crosses 128 in a
    verify step; turn 1 continues; turns 2 and 3 branch off the history at 165. Outputs, inputs, cold outputs."""
    e = make_engine(model_preset="small", speculative_algorithm="DFLASH", mamba_track_interval=128,
                    inject_fault=fault)
    tokens = iter(prompt(400, seed=38))
    [fan, _sib] = tree_sessions(lambda n: [next(tokens) for _ in range(n)], BYTE_TOKENIZER, 128, 8)
    outs, inputs, prev = [], [], (None, None)
    for n, turn in enumerate(fan.turns):
        ids = fan.turn_input(n, *prev)
        outs.append(e.generate([req(f"fan{n}", ids, turn.max_new_tokens)])[0])
        inputs.append(ids)
        prev = (ids, list(outs[-1].output_ids))
    return outs, inputs, [_cold_small(ids, len(o.output_ids)) for ids, o in zip(inputs, outs, strict=True)]


def _moved(o, ref) -> bool:
    """Other tokens, or log-probs beyond the oracle's 1e-3 tolerance, than the cold path's."""
    return o.output_ids != ref.output_ids or max(
        abs(a - b) for a, b in zip(o.output_logprobs, ref.output_logprobs, strict=True)) > 1e-3


@pytest.mark.parametrize("fault", [None, "match-past-checkpoint", "split-inherits-checkpoint"])
def test_split_node_faults_hit_only_the_match_that_ends_at_the_split_node(fault):
    """Boundary kind: restore at a node a split created. Turn 2's insertion splits turn 1's edge at 160 (no
    checkpoint); turn 3's match ends there and falls back to 128, unless a fault makes it resume at 160: with
    the walked KV and the 128 state, or with a copy of turn 1's checkpoint (its 192-token prefix's state)."""
    outs, _, cold = _fan_turns(fault)
    assert [o.cached_tokens for o in outs] == [0, 128, 128, 128 if fault is None else 160]
    assert [_moved(o, ref) for o, ref in zip(outs, cold, strict=True)] == [False, False, False, fault is not None]
