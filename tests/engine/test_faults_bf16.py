"""Every registered fault still changes behaviour on the bf16 engine (--dtype bfloat16).

A fault is about which state is saved or restored, not about numerics, so each one is
run in the same test shape as its fp32 test (tests/engine/test_faults.py) twice on the
bf16 engine, clean and with the fault; the two runs share every numeric path, so any
difference is the fault's. The faulted run must change tokens where the fault bites, and
be bit-identical to the clean run where it cannot (the same batch is deterministic), and the
engine's own report of the requests the fault reached (`injected_fault_hit`) names exactly the
exposed ones.
"""

from __future__ import annotations

import functools

import pytest

from engine.faults import FAULTS
from protocol.tokenizer import BYTE_TOKENIZER
from tests.engine.sessions import SUFFIX, make_engine, prompt, req
from workloads.tree import tree_sessions

BF16 = dict(model_preset="small", dtype="bfloat16")


def _outputs_key(o) -> tuple:
    return tuple(o.output_ids), tuple(o.output_logprobs), o.cached_tokens


def _two_turns(engine, ids, n1=24, n2=16, tail=None):
    o1 = engine.generate([req("t1", ids, n1)])[0]
    ids2 = tail(ids) if tail else tuple(ids) + tuple(o1.output_ids) + SUFFIX
    return o1, engine.generate([req("t2", ids2, n2)])[0]


# --- the scenarios: the fp32 tests' shapes; each returns [(output, the fault can bite it)] -------------------

def _verify_checkpoint_sessions(fault):
    """test_faults._run: 5 sessions whose turn 1 crosses 128 inside a verify step; turn 2 resumes there."""
    e = make_engine(**BF16, speculative_algorithm="DFLASH", speculative_num_draft_tokens=8, mamba_track_interval=128,
                    inject_fault=fault)
    out = []
    for off, seed in ((-7, 693), (-5, 695), (-3, 697), (-1, 699), (128 - 4, 1)):
        o1, o2 = _two_turns(e, prompt(128 + off, seed=seed))
        out += [(o1, False), (o2, True)]
    return out


def _prefill_off_boundary(fault):
    e = make_engine(**BF16, mamba_track_interval=256, inject_fault=fault)
    o1, o2 = _two_turns(e, prompt(1000, seed=31), n1=4, tail=lambda ids: tuple(ids[:980]) + tuple(prompt(40, 32)))
    assert o2.cached_tokens == 960
    return [(o1, False), (o2, True)]


def _pingpong(fault):
    e = make_engine(**BF16, mamba_track_interval=128, inject_fault=fault)
    o1, o2 = _two_turns(e, prompt(120, seed=33))
    assert o2.cached_tokens == 128
    return [(o1, False), (o2, True)]


def _evict_matched(fault):
    e = make_engine(**BF16, mamba_track_interval=64, max_running_requests=2, max_state_slots=6, inject_fault=fault)
    a = prompt(60, seed=34)
    o1 = e.generate([req("a1", a, 20)])[0]
    e.submit(req("x", prompt(40, seed=35), 60))
    while not (e.sched.running and e.sched.running[0].out.output_ids):
        e.step()
    e.submit(req("a2", tuple(a) + tuple(o1.output_ids) + SUFFIX, 16))
    outs = {}
    while e.has_work:
        outs.update({o.rid: o for o in e.step() if o.finished})
    assert outs["a2"].cached_tokens == 64
    assert e.stats()["checkpoint_evictions"] == (1 if fault else 0)
    # `x` shares its batches with a2, whose wrong state changes what the batch computes from then on: in bf16 the
    # same request in another batch is not the same bits (docs/engine.md, "Dtypes"), so x is not compared
    return [(o1, False), (outs["a2"], True)]


def _conv_rollback(fault):
    e = make_engine(**BF16, speculative_algorithm="DFLASH", disable_radix_cache=True, inject_fault=fault)
    o = e.generate([req("a", prompt(90, seed=36), 32)])[0]
    assert any(c < 8 for _, c, _ in o.spec_trace)  # partial acceptance happened
    return [(o, True)]


def _track_dropped(fault):
    """A 127-token prompt crosses 128 in its first verify (right after it joined the batch): exposed; a 100-token
    one crosses later, in an unchanged batch: not exposed."""
    out = []
    for plen, exposed in ((127, True), (100, False)):
        e = make_engine(**BF16, speculative_algorithm="DFLASH", mamba_track_interval=128, inject_fault=fault)
        o1, o2 = _two_turns(e, prompt(plen, seed=37), n1=40)
        assert o2.cached_tokens == 128
        out += [(o1, False), (o2, exposed)]
    return out


def _fan(fault):
    """test_faults._fan_turns: the frozen suite's `fan` session; only turn 3's match ends at the node turn 2's
    insertion split off (no checkpoint of its own), where the two split-node faults act."""
    e = make_engine(**BF16, speculative_algorithm="DFLASH", mamba_track_interval=128, inject_fault=fault)
    tokens = iter(prompt(400, seed=38))
    [fan, _sib] = tree_sessions(lambda n: [next(tokens) for _ in range(n)], BYTE_TOKENIZER, 128, 8)
    out, prev = [], (None, None)
    for n, turn in enumerate(fan.turns):
        ids = fan.turn_input(n, *prev)
        o = e.generate([req(f"fan{n}", ids, turn.max_new_tokens)])[0]
        out.append((o, n == 3))
        prev = (ids, list(o.output_ids))
    assert [o.cached_tokens for o, _ in out] == [0, 128, 128, 128 if fault is None else 160]
    return out


SCENARIOS = {
    "match-past-checkpoint": _fan,
    "split-inherits-checkpoint": _fan,
    "stale-seq-lens": _verify_checkpoint_sessions,
    "track-off-by-one": _verify_checkpoint_sessions,
    "conv-not-tracked": _verify_checkpoint_sessions,
    "insert-working-state": _verify_checkpoint_sessions,
    "prefill-checkpoint-off-boundary": _prefill_off_boundary,
    "pingpong-double-flip": _pingpong,
    "evict-matched-checkpoint": _evict_matched,
    "conv-rollback-wrong-step": _conv_rollback,
    "track-dropped-on-batch-change": _track_dropped,
}
# how many of the exposed outputs must change tokens (the fp32 tests' expectations)
MIN_CHANGED = {"track-off-by-one": 1, "conv-not-tracked": 1, "insert-working-state": 1}


@functools.cache
def _clean(scenario) -> list:
    return scenario(None)


def test_every_registered_fault_has_a_bf16_scenario():
    assert set(SCENARIOS) == set(FAULTS)


@pytest.mark.parametrize("fault", sorted(SCENARIOS))
def test_fault_changes_behaviour_in_bf16(fault):
    scenario = SCENARIOS[fault]
    clean, faulted = _clean(scenario), scenario(fault)
    exposed = [(c, f) for (c, bites), (f, _) in zip(clean, faulted, strict=True) if bites]
    unexposed = [(c, f) for (c, bites), (f, _) in zip(clean, faulted, strict=True) if not bites]
    changed = sum(c.output_ids != f.output_ids for c, f in exposed)
    assert changed >= MIN_CHANGED.get(fault, len(exposed)), f"{changed} of {len(exposed)} exposed outputs changed"
    # where the fault cannot bite, the faulted run is bit for bit the clean one
    for c, f in unexposed:
        assert _outputs_key(c) == _outputs_key(f), c.rid
    # the engine reports which requests the fault reached: exactly the exposed ones; nothing without a fault
    assert [f.injected_fault_hit for f, _ in faulted] == [bites for _, bites in faulted]
    assert [c.injected_fault_hit for c, _ in clean] == [None] * len(clean)
