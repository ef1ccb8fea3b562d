"""engine/sampling.py: each sampling parameter against a naive reference, the defaults bit-identical to the plain
computation, and speculative decoding choosing as plain decoding does under penalties and bans."""

from __future__ import annotations

import math

import pytest
import torch

from engine.io_struct import SamplingParams
from engine.sampling import block_logits, probs, processed_logits, sample
from protocol.tokenizer import EOS_ID, VOCAB_SIZE
from tests.engine.sessions import make_engine, prompt, req

INF = float("-inf")


def logits_of(values: dict[int, float], base: float = -5.0) -> torch.Tensor:
    x = torch.full((VOCAB_SIZE,), base)
    for t, v in values.items():
        x[t] = v
    return x


def test_defaults_are_the_plain_computation_bit_for_bit():
    x = torch.randn(VOCAB_SIZE, generator=torch.Generator().manual_seed(1))
    sp = SamplingParams()
    assert processed_logits(x, sp, [1, 2, 3]) is x
    assert sample(x, sp, None, [1, 2]) == int(torch.argmax(x))
    hot = SamplingParams(temperature=0.7)
    plain = torch.softmax(x.float() / 0.7, dim=-1)
    assert torch.equal(probs(x, hot), plain)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    draws = [sample(x, hot, g1) for _ in range(50)]
    assert draws == [int(torch.multinomial(plain, 1, generator=g2)) for _ in range(50)]
    rows = x[None].repeat(3, 1)
    assert block_logits(rows, sp, [4], [5, 6]) is rows


def naive_keep(p: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """The tokens SGLang's filters keep, by a sort in Python (ties: lower id first)."""
    order = sorted(range(len(p)), key=lambda t: (-p[t], t))
    keep, mass = set(), 0.0
    for rank, t in enumerate(order):
        if (top_k <= 0 or rank < top_k) and mass <= top_p + 1e-12 and p[t] >= p[order[0]] * min_p:
            keep.add(t)
        mass += p[t]
    return keep


@pytest.mark.parametrize("top_k,top_p,min_p,want", [
    (-1, 1.0, 0.0, None),  # nothing cut
    (0, 1.0, 0.0, None),  # vLLM's spelling of "all"
    (1, 1.0, 0.0, {10}),
    (2, 1.0, 0.0, {10, 11}),
    (-1, 0.45, 0.0, {10}),  # 10 alone holds 0.5 of the mass
    (-1, 0.55, 0.0, {10, 11}),  # a token is kept while the mass before it is within top_p
    (-1, 0.7, 0.0, {10, 11}),
    (-1, 0.8, 0.0, {10, 11, 12}),
    (-1, 1.0, 0.5, {10, 11}),  # 11 (0.25) >= 0.5 x 0.5; 12 (0.125) is not
    (-1, 1.0, 0.25, {10, 11, 12}),
    (2, 0.9, 0.0, {10, 11}),  # top_k and top_p intersect
    (3, 0.6, 0.4, {10, 11}),
])
def test_filters_keep_what_sglang_keeps(top_k, top_p, min_p, want):
    # probabilities 1/2, 1/4, 1/8, 1/16 and the rest spread over the other tokens
    x = logits_of({10: math.log(0.5), 11: math.log(0.25), 12: math.log(0.125), 13: math.log(0.0625)},
                  base=math.log(0.0625 / (VOCAB_SIZE - 4)))
    sp = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
    p = probs(x, sp)
    kept = {int(t) for t in torch.nonzero(p).flatten()}
    assert kept == (set(range(VOCAB_SIZE)) if want is None else want)
    assert kept == naive_keep(torch.softmax(x, -1).tolist(), top_k, top_p, min_p)
    assert math.isclose(float(p.sum()), 1.0, abs_tol=1e-6)
    plain = torch.softmax(x, -1)
    assert torch.allclose(p[list(kept)], plain[list(kept)] / plain[list(kept)].sum())


@pytest.mark.parametrize("seed", range(5))
def test_filters_match_the_naive_reference_on_random_logits(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(VOCAB_SIZE, generator=g) * 3
    for top_k, top_p, min_p in [(5, 1.0, 0.0), (-1, 0.3, 0.0), (-1, 1.0, 0.2), (40, 0.9, 0.05)]:
        sp = SamplingParams(temperature=0.8, top_k=top_k, top_p=top_p, min_p=min_p)
        kept = {int(t) for t in torch.nonzero(probs(x, sp)).flatten()}
        assert kept == naive_keep(torch.softmax(x / 0.8, -1).tolist(), top_k, top_p, min_p)


def test_seeded_draws_follow_the_filtered_distribution():
    x = logits_of({10: math.log(0.5), 11: math.log(0.3), 12: math.log(0.2)}, base=-30.0)
    sp = SamplingParams(temperature=1.0, top_k=2, seed=3)
    g = torch.Generator().manual_seed(3)
    counts = torch.bincount(torch.tensor([sample(x, sp, g) for _ in range(4000)]), minlength=VOCAB_SIZE)
    assert set(torch.nonzero(counts).flatten().tolist()) == {10, 11}
    assert abs(float(counts[10]) / 4000 - 0.5 / 0.8) < 0.03


@pytest.mark.parametrize("params,output,want", [
    # token: logit after processing (tokens not named keep theirs); logits 10: 2.0, 11: -1.0, 12: 0.5
    (dict(repetition_penalty=2.0), [10, 11], {10: 1.0, 11: -2.0, 12: 0.5}),
    (dict(repetition_penalty=0.5), [10, 11, 11], {10: 4.0, 11: -0.5, 12: 0.5}),
    (dict(frequency_penalty=0.5), [10, 11, 11], {10: 1.5, 11: -2.0, 12: 0.5}),
    (dict(presence_penalty=0.5), [10, 11, 11], {10: 1.5, 11: -1.5, 12: 0.5}),
    (dict(frequency_penalty=-1.0, presence_penalty=1.0), [12, 12], {10: 2.0, 12: 1.5}),
    (dict(repetition_penalty=2.0, frequency_penalty=1.0), [10], {10: 0.0}),  # scaled, then subtracted
    (dict(frequency_penalty=1.0), [], {10: 2.0, 11: -1.0}),  # penalties look at the output only
    (dict(logit_bias=((11, 5.0), (10, -1.5))), [10], {10: 0.5, 11: 4.0, 12: 0.5}),
    (dict(allowed_token_ids=(11, 12)), [], {10: INF, 11: -1.0, 12: 0.5, 0: INF}),
    (dict(min_new_tokens=2, stop_token_ids=(12,)), [10], {EOS_ID: INF, 12: INF, 10: 2.0}),
    (dict(min_new_tokens=2, stop_token_ids=(12,)), [10, 10], {EOS_ID: 3.0, 12: 0.5}),  # reached: nothing banned
    (dict(min_new_tokens=1, ignore_eos=True), [], {EOS_ID: INF}),  # as SGLang and vLLM: EOS banned all the same
    (dict(bad_words=((12,),)), [], {12: INF}),
    (dict(bad_words=((10, 11, 12),)), [5, 10, 11], {12: INF, 10: 2.0}),
    (dict(bad_words=((10, 11, 12),)), [10, 5], {12: 0.5}),  # its other tokens do not end the output
    (dict(bad_words=((10, 11, 12),)), [11], {12: 0.5}),
])
def test_penalties_bias_and_bans(params, output, want):
    x = logits_of({10: 2.0, 11: -1.0, 12: 0.5, EOS_ID: 3.0})
    sp = SamplingParams(max_new_tokens=8, **params)
    y = processed_logits(x, sp, output)
    expected = x.clone()
    if "allowed_token_ids" in params:
        expected[[t for t in range(VOCAB_SIZE) if t not in params["allowed_token_ids"]]] = INF
    for t, v in want.items():
        expected[t] = v
    assert torch.equal(y, expected)
    assert x[10] == 2.0  # the model's logits are not written to


def test_bans_give_way_rather_than_leave_no_token():
    x = logits_of({10: 2.0, 11: 1.0})
    only_stop = SamplingParams(max_new_tokens=4, min_new_tokens=2, allowed_token_ids=(EOS_ID,))
    assert sample(x, only_stop, None, []) == EOS_ID  # the allowed set wins over the min_new_tokens ban
    bad = SamplingParams(max_new_tokens=4, allowed_token_ids=(10,), bad_words=((10,),))
    assert sample(x, bad, None, []) == 10


def test_greedy_honours_penalties_and_bias():
    x = logits_of({10: 2.0, 11: 1.0, 12: 0.5})
    assert sample(x, SamplingParams(), None, [10]) == 10
    assert sample(x, SamplingParams(presence_penalty=1.5), None, [10]) == 11
    assert sample(x, SamplingParams(logit_bias=((12, 2.0),)), None, []) == 12
    assert sample(x, SamplingParams(top_k=1, temperature=1.0), torch.Generator().manual_seed(0), []) == 10


def test_block_rows_see_the_drafts_before_them():
    x = torch.randn(4, VOCAB_SIZE, generator=torch.Generator().manual_seed(2))
    sp = SamplingParams(frequency_penalty=0.7, repetition_penalty=1.3, bad_words=((7, 8),), min_new_tokens=2)
    out, drafts = [7, 7], [8, 7, 9]
    rows = block_logits(x, sp, out, drafts)
    for i in range(4):
        assert torch.equal(rows[i], processed_logits(x[i], sp, out + drafts[:i]))


@pytest.fixture(scope="module")
def engines():
    """(plain, speculative) engines without a prefix cache; the scripted drafter accepts 0..B-1 drafts in turn."""
    return (make_engine(disable_radix_cache=True),
            make_engine(speculative_algorithm="DFLASH", speculative_num_draft_tokens=4, mamba_track_interval=64,
                        drafter_mode="scripted", scripted_accept=-1, disable_radix_cache=True))


@pytest.mark.parametrize("params", [
    dict(presence_penalty=1.0), dict(frequency_penalty=0.6, repetition_penalty=1.5),
    dict(bad_words=((0, 0), (6, 6)), logit_bias=((81, 2.0),)), dict(min_new_tokens=12, stop_token_ids=(0, 6)),
])
def test_speculative_greedy_equals_plain_greedy_under_penalties(engines, params):
    plain, spec = engines
    ids = prompt(50, 11)
    want = plain.generate([req("c", ids, 24, temperature=0.0, **params)])[0].output_ids
    assert spec.generate([req("s", ids, 24, temperature=0.0, **params)])[0].output_ids == want
    assert want != plain.generate([req("p", ids, 24, temperature=0.0)])[0].output_ids  # the parameters bite


def test_speculative_sampling_with_top_k_1_is_greedy():
    ids = prompt(40, 12)
    greedy = make_engine().generate([req("g", ids, 16, temperature=0.0)])[0]
    spec = make_engine(speculative_algorithm="DFLASH", mamba_track_interval=64)
    out = spec.generate([req("s", ids, 16, temperature=1.3, top_k=1, seed=4)])[0]
    assert out.output_ids == greedy.output_ids
