"""Token choice and log-probabilities (pure functions over logits).

A token is chosen as SGLang's sampler chooses it, in two stages:

1. Logit processing, which depends on what the request generated so far
   (`output_ids`): the repetition penalty (logits of tokens already generated
   are divided by it where positive, multiplied where negative), then the
   frequency and presence penalties (subtracted per occurrence / once), then
   `logit_bias`; then bans: tokens outside `allowed_token_ids`, EOS and the stop
   tokens while fewer than `min_new_tokens` are out, and the last token of a bad
   word whose other tokens end the output.
2. Greedy (temperature below 1e-6): the argmax, lowest id on ties. Otherwise
   softmax(logits / T) cut to `top_k`, `top_p` (on the full distribution, as
   SGLang's, not on what top_k left) and `min_p`, renormalized, and one draw
   from the request's seeded generator.

A request that sets none of them is sampled by exactly the plain computation
(argmax of the raw logits, or softmax(logits / T)), so greedy outputs stay
bit-identical. Log-probs are always those of the raw logits (`logprob_info`),
whatever the sampling parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.io_struct import SamplingParams
from protocol.tokenizer import EOS_ID

GREEDY_BELOW = 1e-6  # SGLang's _SAMPLING_EPS: smaller temperatures are greedy (logits / T would overflow)


def logprob_info(logits: torch.Tensor, token: int, top_k: int) -> tuple[float, list[tuple[float, int]]]:
    """(logprob of token, top-k [(logprob, id)] best first) under the unscaled distribution."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[float, int]] = []
    if top_k > 0:
        vals, ids = lp.topk(top_k)
        top = [(float(v), int(i)) for v, i in zip(vals, ids, strict=True)]
    return float(lp[token]), top


def processes_logits(sp: SamplingParams) -> bool:
    """Whether stage 1 changes anything for this request."""
    return bool(sp.repetition_penalty != 1.0 or sp.frequency_penalty or sp.presence_penalty or sp.logit_bias
                or sp.allowed_token_ids is not None or sp.bad_words or sp.min_new_tokens > 0)


def filters_probs(sp: SamplingParams) -> bool:
    """Whether top_k, top_p or min_p cut the sampling distribution."""
    return sp.top_k > 0 or sp.top_p < 1.0 or sp.min_p > 0.0


def processed_logits(logits: torch.Tensor, sp: SamplingParams, output_ids: Sequence[int]) -> torch.Tensor:
    """logits [V] after the request's penalties, bias and bans, given its output so far; `logits` itself (the same
    tensor) when none apply."""
    if not processes_logits(sp):
        return logits
    x = logits.float().clone()
    vocab = x.shape[-1]
    if output_ids and (sp.repetition_penalty != 1.0 or sp.frequency_penalty or sp.presence_penalty):
        counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab)[:vocab]  # [V]
        seen = counts > 0
        if sp.repetition_penalty != 1.0:
            x = torch.where(seen, torch.where(x > 0, x / sp.repetition_penalty, x * sp.repetition_penalty), x)
        x = x - sp.frequency_penalty * counts.float() - sp.presence_penalty * seen.float()
    for token, bias in sp.logit_bias:
        x[token] += bias
    banned = _bans(sp, output_ids, vocab)
    if banned is not None:
        x = x.masked_fill(banned, float("-inf"))
    return x


def _bans(sp: SamplingParams, output_ids: Sequence[int], vocab: int) -> torch.Tensor | None:
    """The tokens this step may not sample ([V] bool), or None. allowed_token_ids always holds; the min_new_tokens
    and bad-word bans give way in a step where they would leave no token at all (the engine must sample one)."""
    hard = None
    if sp.allowed_token_ids is not None:
        hard = torch.ones(vocab, dtype=torch.bool)
        hard[list(sp.allowed_token_ids)] = False
    soft: list[int] = []
    if len(output_ids) < sp.min_new_tokens:
        soft += [EOS_ID, *sp.stop_token_ids]
    for word in sp.bad_words:
        prefix = word[:-1]
        if len(output_ids) >= len(prefix) and tuple(output_ids[len(output_ids) - len(prefix):]) == prefix:
            soft.append(word[-1])
    if not soft:
        return hard
    banned = torch.zeros(vocab, dtype=torch.bool) if hard is None else hard.clone()
    banned[soft] = True
    return hard if bool(banned.all()) else banned


def block_logits(logits: torch.Tensor, sp: SamplingParams, output_ids: Sequence[int],
                 drafts: Sequence[int]) -> torch.Tensor:
    """A verify block's logits [n, V] processed row by row: row i chooses the token after drafts[:i], so it sees
    them as output (what sequential decoding would have seen had they been accepted); `logits` when none apply."""
    if not processes_logits(sp):
        return logits
    return torch.stack([processed_logits(logits[i], sp, [*output_ids, *drafts[:i]]) for i in range(logits.shape[0])])


def probs(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """The sampling distribution [..., V] at temperature sp.temperature > 0: softmax(logits / T), cut to top_k,
    top_p and min_p and renormalized."""
    p = torch.softmax(logits.float() / sp.temperature, dim=-1)
    return _filtered(p, sp) if filters_probs(sp) else p


def _filtered(p: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """p [..., V] with the tokens top_k, top_p and min_p drop set to 0, renormalized (SGLang's rules: top_p on the
    cumulative mass of the full sorted distribution, min_p relative to the most likely token)."""
    sorted_p, order = torch.sort(p, dim=-1, descending=True, stable=True)  # stable: ties keep the lower id first
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if sp.top_k > 0:
        keep[..., sp.top_k:] = False
    if sp.top_p < 1.0:
        keep &= (torch.cumsum(sorted_p, dim=-1) - sorted_p) <= sp.top_p  # the mass before a token is under top_p
    if sp.min_p > 0.0:
        keep &= sorted_p >= sorted_p[..., :1] * sp.min_p
    kept = torch.where(torch.zeros_like(keep).scatter(-1, order, keep), p, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(logits: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None,
           output_ids: Sequence[int] = ()) -> int:
    """The next token from logits [V] of a request that has generated `output_ids`: greedy below GREEDY_BELOW
    (lowest id on ties), else a draw from `probs` with the request's seeded generator."""
    x = processed_logits(logits, sp, output_ids)
    if sp.temperature < GREEDY_BELOW:
        return int(torch.argmax(x))
    return int(torch.multinomial(probs(x, sp), 1, generator=generator))
