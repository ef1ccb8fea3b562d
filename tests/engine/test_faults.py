"""Each injected fault changes behaviour; stale-seq-lens (#37817) poisons exactly the verify-crossed checkpoints."""

import pytest

from engine.faults import FAULTS
from tests.engine.sessions import SUFFIX, make_engine, prompt, req

B, I = 8, 128


def _sessions():
    # turn-1 prompts just below a boundary: decoding crosses it inside a verify step
    return [prompt(I + off, seed=700 + off) for off in (-7, -5, -3, -1)] + [prompt(2 * I - 4, seed=1)]


def _run(fault):
    # the `small` preset: its linear layers remember long enough, and its logits are peaked enough,
    # that a wrong restored state shows up as changed tokens (the tiny preset forgets within ~30 tokens)
    cand = make_engine(model_preset="small", speculative_algorithm="DFLASH", speculative_num_draft_tokens=B,
                       mamba_track_interval=I, inject_fault=fault)
    cold = make_engine(model_preset="small", disable_radix_cache=True)
    results = []
    for i, ids in enumerate(_sessions()):
        o1 = cand.generate([req(f"f{i}-1", ids, 24)])[0]
        ids2 = tuple(ids) + tuple(o1.output_ids) + SUFFIX
        o2 = cand.generate([req(f"f{i}-2", ids2, 16)])[0]
        ref = cold.generate([req("c", ids2, 16)])[0]
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
    assert "stale-seq-lens" in FAULTS and len(FAULTS) >= 4
    for f in FAULTS.values():
        assert len(f.doc) > 200 and f.summary
