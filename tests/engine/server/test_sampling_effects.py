"""Each honoured sampling field changes the tokens as it says, end to end: over HTTP to the real server (DFlash,
so the speculative path chooses them), checked against the raw log-probs the answer itself carries."""

from __future__ import annotations

import math

import pytest

from protocol.tokenizer import BYTE_TOKENIZER, VOCAB_SIZE

pytestmark = pytest.mark.slow

PROMPT = tuple(BYTE_TOKENIZER.encode("def fibonacci(n):\n    "))
N = 12
N_REPEATS = 32  # the random model's greedy output first repeats a token after about 20


def run(server, n: int = N, **sampling) -> tuple[list[int], list[dict[int, float]]]:
    """(output ids, per position {token: raw log-prob} over the whole vocabulary) of a /generate call."""
    ans = server.generate(input_ids=list(PROMPT), return_logprob=True, top_logprobs_num=VOCAB_SIZE,
                          sampling_params={"max_new_tokens": n, "ignore_eos": True, **sampling})
    tops = [{t: lp for lp, t, _ in top} for top in ans["meta_info"]["output_top_logprobs"]]
    return ans["output_ids"], tops


@pytest.fixture(scope="module")
def greedy(server):
    return run(server, temperature=0)[0]


def rank_mass(dist: dict[int, float], token: int) -> tuple[int, float]:
    """(rank of token, probability mass of the tokens ranked above it) under the raw distribution."""
    ranked = sorted(dist, key=lambda t: (-dist[t], t))
    r = ranked.index(token)
    return r, sum(math.exp(dist[t]) for t in ranked[:r])


def penalized_argmax(dist: dict[int, float], before: list[int], frequency: float, presence: float) -> int:
    return max(dist, key=lambda t: (dist[t] - frequency * before.count(t) - presence * (t in before), -t))


@pytest.mark.parametrize("sampling", [
    dict(temperature=1.5, top_k=1, seed=3), dict(temperature=1.5, top_p=1e-6, seed=3),
    dict(temperature=1.5, min_p=1.0, seed=3),
], ids=["top_k=1", "top_p=1e-6", "min_p=1"])
def test_filters_that_keep_one_token_are_greedy(server, greedy, sampling):
    assert run(server, **sampling)[0] == greedy


@pytest.mark.parametrize("sampling,holds", [
    (dict(top_k=3), lambda rank, mass, p, pmax: rank < 3),
    (dict(top_p=0.5), lambda rank, mass, p, pmax: mass <= 0.5 + 1e-5),
    (dict(min_p=0.3), lambda rank, mass, p, pmax: p >= 0.3 * pmax - 1e-6),
], ids=["top_k=3", "top_p=0.5", "min_p=0.3"])
def test_seeded_draws_stay_inside_the_filter(server, greedy, sampling, holds):
    ids, tops = run(server, temperature=1.0, seed=11, **sampling)
    assert run(server, temperature=1.0, seed=11, **sampling)[0] == ids  # seeded
    for tok, dist in zip(ids, tops, strict=True):
        rank, mass = rank_mass(dist, tok)
        assert holds(rank, mass, math.exp(dist[tok]), math.exp(max(dist.values()))), (tok, rank, mass)
    unfiltered = run(server, temperature=1.0, seed=11)[0]
    assert ids != greedy or unfiltered != greedy  # the draws were not all forced greedy by chance


@pytest.mark.parametrize("frequency,presence", [(2.0, 0.0), (0.0, 1.0), (-2.0, 2.0)])
def test_greedy_penalties_choose_the_penalized_argmax(server, frequency, presence):
    ids, tops = run(server, N_REPEATS, temperature=0, frequency_penalty=frequency, presence_penalty=presence)
    assert ids != run(server, N_REPEATS, temperature=0)[0]
    for i, (tok, dist) in enumerate(zip(ids, tops, strict=True)):
        assert tok == penalized_argmax(dist, ids[:i], frequency, presence), i


def test_repetition_penalty_changes_greedy_output_deterministically(server):
    ids = run(server, N_REPEATS, temperature=0, repetition_penalty=1.8)[0]
    assert ids != run(server, N_REPEATS, temperature=0)[0]
    assert run(server, N_REPEATS, temperature=0, repetition_penalty=1.8)[0] == ids


def test_logit_bias_and_seed(server, greedy):
    assert run(server, temperature=0, logit_bias={"97": 100})[0] == [97] * N
    assert run(server, temperature=0, logit_bias={str(greedy[0]): -100})[0][0] != greedy[0]
    a, b, c = (run(server, temperature=1.0, seed=s)[0] for s in (7, 7, -7))
    assert a == b != c


def test_min_new_tokens_keeps_stop_tokens_out(server, greedy):
    stop = greedy[1]
    ids = run(server, temperature=0, min_new_tokens=N, stop_token_ids=[stop])[0]
    assert len(ids) == N and stop not in ids


def completion(server, **body) -> dict:
    r = server.call("POST", "/v1/completions", {"prompt": list(PROMPT), "max_tokens": N, "temperature": 0,
                                                "ignore_eos": True, "return_token_ids": True, **body})
    assert r.status == 200, r.body
    return r.json()["choices"][0]


def test_allowed_token_ids_and_bad_words(server):
    assert set(completion(server, allowed_token_ids=[97, 98, 99])["token_ids"]) <= {97, 98, 99}
    banned = completion(server, allowed_token_ids=[97, 98], bad_words=["ab", "ba"])
    assert banned["text"] in ("a" * N, "b" * N)  # every switch between them completes a bad word


def test_stop_strings_stay_with_include_stop_str_in_output(server):
    forced = {"logit_bias": {"97": 100}, "stop": ["aaa"]}
    assert completion(server, **forced)["text"] == ""
    kept = completion(server, include_stop_str_in_output=True, **forced)
    assert kept["text"] == "aaa" and kept["finish_reason"] == "stop"
    assert completion(server, no_stop_trim=True, **forced)["text"] == "aaa"
    r = server.call("POST", "/v1/completions", {"prompt": list(PROMPT), "max_tokens": N, "temperature": 0,
                                                "stream": True, "include_stop_str_in_output": True, **forced})
    assert "".join(e["choices"][0]["text"] for e in r.events() if e != "[DONE]" and e["choices"]) == "aaa"


def test_chat_without_max_tokens_stops_at_128(server):
    r = server.call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                     "ignore_eos": True, "temperature": 0})
    assert r.status == 200, r.body
    assert r.json()["usage"]["completion_tokens"] == 128 and r.json()["choices"][0]["finish_reason"] == "length"
