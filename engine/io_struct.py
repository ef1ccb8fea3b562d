"""Request and result types shared by the engine, its server and tests.

Plain frozen dataclasses: the scheduler owns mutable per-request state
elsewhere; these are what crosses the engine's boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens (SGLang's sampling parameters; engine/sampling.py applies them).

    temperature 0 (below 1e-6) is greedy; above it a draw with `seed`. The defaults change nothing: a request
    that sets none of the filters, penalties, bias or bans is sampled exactly as plain softmax / argmax.
    """

    temperature: float = 0.0
    max_new_tokens: int = 128
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings, matched on decoded output text
    seed: int | None = None
    # before this many tokens no stop condition ends the request and EOS and the stop tokens are not sampled
    # (SGLang's min_new_tokens / vLLM's min_tokens); the length limit still applies
    min_new_tokens: int = 0
    top_p: float = 1.0  # sample from the smallest set of most likely tokens whose mass reaches top_p
    top_k: int = -1  # sample from the k most likely tokens; -1 or 0: all
    min_p: float = 0.0  # drop tokens less likely than min_p x the most likely one's probability
    # penalties over the tokens generated so far (not the prompt, as SGLang)
    frequency_penalty: float = 0.0  # subtracted from a token's logit once per occurrence
    presence_penalty: float = 0.0  # subtracted once if the token occurred
    repetition_penalty: float = 1.0  # a positive logit of an occurred token is divided by it, a negative multiplied
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    allowed_token_ids: tuple[int, ...] | None = None  # only these may be sampled (vLLM)
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences never completed in the output (vLLM)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in 0..max_new_tokens ({self.max_new_tokens}), "
                             f"got {self.min_new_tokens}")
        if not 0 < self.top_p <= 1 or self.top_k < -1 or not 0 <= self.min_p <= 1 or self.repetition_penalty <= 0:
            raise ValueError(f"need 0 < top_p <= 1, top_k >= -1, 0 <= min_p <= 1, repetition_penalty > 0; got "
                             f"{self.top_p}, {self.top_k}, {self.min_p}, {self.repetition_penalty}")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must not be empty (None allows every token)")
        if any(not w for w in self.bad_words):
            raise ValueError("a bad word must have at least one token")


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request: prompt token ids and how to continue them."""

    rid: str
    input_ids: tuple[int, ...]
    sampling: SamplingParams = SamplingParams()
    return_logprob: bool = False
    top_logprobs_num: int = 0
    # SGLang's logprob_start_len: with return_logprob and a start >= 0, the prompt tokens from this position on
    # are scored too, and the prefix match is capped at it (as SGLang does) so that they are all computed
    logprob_start_len: int = -1

    @property
    def scores_prompt(self) -> bool:
        """The request asks for the log-probs of its prompt tokens from `logprob_start_len` on."""
        return self.return_logprob and 0 <= self.logprob_start_len <= len(self.input_ids)


@dataclass
class GenerateOutput:
    """What a request produced so far (`finished` once done).

    Lists are cumulative. `finish_reason` follows SGLang:
    {"type": "length", "length": N} / {"type": "stop", "matched": id_or_str} /
    {"type": "abort", "message": str}.
    """

    rid: str
    prompt_tokens: int
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    # per generated token: top-k (logprob, token_id), best first
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    # prompt tokens from the request's logprob_start_len L on (GenerateRequest.scores_prompt): the log-prob of each
    # under the logits of the position before it; None for token L itself, whose position before lies before L
    # (SGLang's entry 0, always None)
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    cached_tokens: int = 0
    finished: bool = False
    finish_reason: dict | None = None
    spec_verify_ct: int = 0
    spec_trace: list[tuple[int, int, int]] = field(default_factory=list)  # (pre_len, commit_len, tracked_step)
    error: str | None = None
    # with a fault injected (engine/faults.py): whether it reached this request (it resumed from, or computed, a
    # state the fault corrupted: engine/cache/state_pool.py, `tainted`); None when no fault is injected
    injected_fault_hit: bool | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def spec_accept_length(self) -> float:
        """Completion tokens per verify step (SGLang's definition); 0 without speculation."""
        return self.completion_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0
