"""Stop conditions (stopping.finish_reason) and min_new_tokens, as vLLM's stop checker orders them."""

from __future__ import annotations

import pytest

from engine.io_struct import SamplingParams
from engine.stopping import finish_reason
from protocol.tokenizer import EOS_ID


@pytest.mark.parametrize("token,output,params,want", [
    (EOS_ID, [97, EOS_ID], SamplingParams(), {"type": "stop", "matched": EOS_ID}),
    (EOS_ID, [97, EOS_ID], SamplingParams(ignore_eos=True), None),
    (98, [97, 98], SamplingParams(stop_token_ids=(98,)), {"type": "stop", "matched": 98}),
    (98, [97, 98], SamplingParams(stop=("ab",)), {"type": "stop", "matched": "ab"}),
    (98, [97, 98], SamplingParams(stop=("xy", "b")), {"type": "stop", "matched": "b"}),
    (98, [97, 98], SamplingParams(stop=("ba",)), None),
    (98, [97, 98], SamplingParams(), None),
    (EOS_ID, [97, EOS_ID], SamplingParams(min_new_tokens=3), None),  # no stop before min_new_tokens
    (EOS_ID, [97, 98, EOS_ID], SamplingParams(min_new_tokens=3), {"type": "stop", "matched": EOS_ID}),
    (98, [97, 98], SamplingParams(max_new_tokens=2, min_new_tokens=2), {"type": "length", "length": 2}),
    (98, [97, 98], SamplingParams(max_new_tokens=2, stop_token_ids=(98,)), {"type": "stop", "matched": 98}),
])
def test_stop_reason(token, output, params, want):
    assert output[-1] == token
    assert finish_reason(output, params) == want


def test_min_new_tokens_must_fit_max_new_tokens():
    assert SamplingParams(max_new_tokens=4, min_new_tokens=4).min_new_tokens == 4
    with pytest.raises(ValueError, match=r"min_new_tokens must be in 0\.\.max_new_tokens \(4\), got 5"):
        SamplingParams(max_new_tokens=4, min_new_tokens=5)
