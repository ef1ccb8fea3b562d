"""SGLang's logprob_start_len on the built-in engine: the prompt tokens' log-probs, and the prefix match capped at
the start, so a restored turn can be scored past its checkpoint (the restore window, harness/window.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.io_struct import GenerateRequest, SamplingParams
from tests.engine.sessions import SUFFIX, make_engine, prompt, req


def scoring(rid: str, ids, start: int, top: int = 0, max_new: int = 1) -> GenerateRequest:
    return GenerateRequest(rid, tuple(ids), SamplingParams(max_new_tokens=max_new, ignore_eos=True),
                           return_logprob=True, top_logprobs_num=top, logprob_start_len=start)


def warm(engine, n: int = 70, seed: int = 1):
    """A turn of n prompt tokens and 20 outputs on `engine`, and the next turn's prompt (it + outputs + suffix)."""
    ids = list(prompt(n, seed=seed))
    o = engine.generate([req("t0", ids, 20)])[0]
    return ids + o.output_ids + list(SUFFIX)


def test_a_cold_prompt_is_scored_from_its_start_and_the_first_token_has_no_log_prob():
    ids = list(prompt(90, seed=4))
    e = make_engine(disable_radix_cache=True, chunked_prefill_size=32)  # the prompt runs in three extends
    out = e.generate([scoring("a", ids, 0, top=2)])[0]
    assert out.cached_tokens == 0 and len(out.input_logprobs) == len(ids) == len(out.input_top_logprobs)
    assert out.input_logprobs[0] is None and out.input_top_logprobs[0] == []
    assert all(isinstance(v, float) for v in out.input_logprobs[1:])
    # token p's log-prob is the one the prompt ids[:p] gives it: the first output of that prompt, forced to ids[p]
    for p in (1, 31, 32, 33, 89):  # across extend boundaries too
        alone = make_engine(disable_radix_cache=True).generate([scoring("b", ids[:p], p, top=2)])[0]
        top = dict((t, lp) for lp, t in alone.output_top_logprobs[0])
        if ids[p] in top:
            assert out.input_logprobs[p] == pytest.approx(top[ids[p]], abs=1e-4)
        assert [t for _, t in out.input_top_logprobs[p]] == [t for _, t in alone.output_top_logprobs[0]]
    late = e.generate([scoring("c", ids, 60)])[0]
    assert len(late.input_logprobs) == 30 and late.input_logprobs[0] is None  # as SGLang: token L is never scored
    assert late.input_logprobs[1:] == pytest.approx(out.input_logprobs[61:], abs=1e-5)


def test_the_match_is_capped_at_the_start_so_every_asked_position_is_computed():
    e = make_engine(speculative_algorithm="DFLASH", mamba_track_interval=64)
    ids = warm(e)
    plain = e.generate([req("plain", ids, 1)])[0]
    assert plain.cached_tokens == 64 and plain.input_logprobs == []  # not asked: output log-probs only
    at = e.generate([scoring("at", ids, 64)])[0]
    assert at.cached_tokens == 64 and at.input_logprobs[0] is None  # position 63 was the checkpoint's
    assert all(v is not None for v in at.input_logprobs[1:]) and len(at.input_logprobs) == len(ids) - 64
    below = e.generate([scoring("below", ids, 40)])[0]
    assert below.cached_tokens == 0 and all(v is not None for v in below.input_logprobs[1:])  # no checkpoint <= 40
    unasked = e.generate([GenerateRequest("x", tuple(ids), SamplingParams(max_new_tokens=1), return_logprob=False,
                                          logprob_start_len=10)])[0]
    assert unasked.cached_tokens == 64 and unasked.input_logprobs == []  # SGLang: no log-probs, no cap


@pytest.mark.parametrize("fault,moves", [(None, False), ("stale-seq-lens", True)])
def test_a_restored_window_equals_the_cold_path_unless_the_checkpoint_is_wrong(fault, moves):
    """The restore window's premise: past a right checkpoint the prompt scores as on the cold path (fp32: to float
    rounding); past a stale one it does not."""
    e = make_engine(speculative_algorithm="DFLASH", mamba_track_interval=64, inject_fault=fault,
                    drafter_mode="scripted", scripted_accept=-1)
    ids = warm(e, n=60, seed=7)  # decoding crosses 64 in a verify step
    warm_out = e.generate([scoring("w", ids, 64)])[0]
    cold = make_engine(disable_radix_cache=True).generate([scoring("c", ids, 0)])[0]
    assert warm_out.cached_tokens == 64
    diff = np.abs(np.array(warm_out.input_logprobs[1:]) - np.array(cold.input_logprobs[65:]))
    assert (diff.max() > 1e-2) if moves else (diff.max() < 1e-4)
