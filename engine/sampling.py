"""Token choice and log-probabilities (pure functions over logits)."""

from __future__ import annotations

import torch


def logprob_info(logits: torch.Tensor, token: int, top_k: int) -> tuple[float, list[tuple[float, int]]]:
    """(logprob of token, top-k [(logprob, id)] best first) under the unscaled distribution."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[float, int]] = []
    if top_k > 0:
        vals, ids = lp.topk(top_k)
        top = [(float(v), int(i)) for v, i in zip(vals, ids, strict=True)]
    return float(lp[token]), top


GREEDY_BELOW = 1e-6  # SGLang's _SAMPLING_EPS: smaller temperatures are greedy (logits / T would overflow)


def sample(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """Greedy at temperature 0 (lowest id on ties), else a seeded draw from softmax(logits / T)."""
    if temperature < GREEDY_BELOW:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature, dim=-1)
