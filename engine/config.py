"""EngineConfig: every engine setting, validated in one place (like SGLang's ServerArgs).

Each field carries its command-line help and group in its metadata, so
`python -m engine.serve` builds its flags from this class (engine/server/config.py)
and nothing restates the list of settings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from engine.model.config import PRESETS

SPEC_ALGORITHMS = ("NONE", "DFLASH")
MAMBA_STRATEGIES = ("extra_buffer", "no_buffer")
DRAFTER_MODES = ("model", "scripted")
DTYPES = ("float32", "bfloat16")
MAMBA_SSM_DTYPES = DTYPES


def setting(default, help: str, group: str, choices: tuple | None = None):
    """A config field with its flag's help text, flag group and allowed values."""
    return field(default=default, metadata={"help": help, "group": group, "choices": choices})


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine replica. Names mirror SGLang's server flags (`--model-path` = model_path)."""

    model_path: str = setting("default", "'default' (committed trained weights, else random), 'random' (seeded "
                              "random weights of --model-preset), or a weights directory", "model")
    model_preset: str = setting("small", "architecture used with --model-path random", "model",
                                tuple(sorted(PRESETS)))
    seed: int = setting(0, "seed for random weights and default sampling seed", "model")
    tp_size: int = setting(1, "tensor-parallel ranks", "model")
    device: str = setting("cpu", "torch device ('cpu', 'cuda', 'cuda:1', ...)", "model")
    dtype: str = setting("float32", "dtype of the weights, activations, KV pool and conv windows; also of the "
                         "linear-attention states unless --mamba-ssm-dtype says otherwise. bfloat16 serves as GPU "
                         "engines do (its own numerics, docs/engine.md); the LM head runs in it and the logits are "
                         "converted to fp32 for log-softmax and sampling", "model", DTYPES)
    force_torch_kernels: bool = setting(False, "use the torch reference kernels even on CUDA (A/B checks)", "model")
    enable_deterministic_inference: bool = setting(
        False, "SGLang's flag: a request's tokens and log-probs are bit-identical whatever else is in its batch, "
        "whether its positions were verified or decoded, and whether its prefix was restored from a checkpoint or "
        "prefilled (every token is computed as its lone decode step: engine/deterministic.py; slower)", "model")
    speculative_algorithm: str = setting("NONE", "DFLASH: block drafts verified in one target forward; NONE: plain "
                                         "decoding", "speculative decoding", SPEC_ALGORITHMS)
    speculative_num_draft_tokens: int = setting(8, "DFlash block size B (tokens drafted and verified per step)",
                                                "speculative decoding")
    drafter_mode: str = setting("model", "'model': the DFlash drafter network; 'scripted': drafts copied from the "
                                "target (test aid, engine/spec/scripted.py)", "speculative decoding", DRAFTER_MODES)
    scripted_accept: int = setting(0, "scripted drafter: drafts per block that match the target's greedy tokens "
                                   "(-1 cycles 0..B-1)", "speculative decoding")
    mamba_radix_cache_strategy: str = setting(
        "extra_buffer", "extra_buffer: checkpoint the linear state every --mamba-track-interval tokens; no_buffer: "
        "cache only the final state (needs --page-size 1)", "cache and memory", MAMBA_STRATEGIES)
    mamba_track_interval: int = setting(256, "checkpoint interval I in tokens (a multiple of --page-size, >= the "
                                        "block size)", "cache and memory")
    page_size: int = setting(16, "KV cache page size in tokens", "cache and memory")
    disable_radix_cache: bool = setting(False, "no prefix cache (the cold path)", "cache and memory")
    max_running_requests: int = setting(16, "requests in the running batch at once; more wait in the queue",
                                        "cache and memory")
    max_total_tokens: int = setting(65536, "KV pool capacity in tokens", "cache and memory")
    max_state_slots: int = setting(0, "linear-state pool slots (0: derived from --max-running-requests)",
                                   "cache and memory")
    chunked_prefill_size: int = setting(512, "prompt tokens prefilled per step (all requests together)",
                                        "cache and memory")
    mamba_ssm_dtype: str | None = setting(None, "dtype the recurrent linear-attention (SSM) states are stored in: "
                                          "working states, checkpoints and verify intermediates (computation stays "
                                          "fp32); default: --dtype", "cache and memory", MAMBA_SSM_DTYPES)
    disable_overlap_schedule: bool = setting(False, "process each step's results before scheduling the next one; by "
                                             "default (as in SGLang) a step's results are processed after the next "
                                             "step is launched, one step late", "scheduling")
    inject_fault: str | None = setting(None, "inject a named bug (see the list below) so specgate can prove it "
                                       "detects it", "testing")

    def __post_init__(self) -> None:
        self.validate()

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm == "DFLASH"

    @property
    def ssm_dtype(self) -> str:
        """The dtype the recurrent states are stored in: --mamba-ssm-dtype, else --dtype."""
        return self.mamba_ssm_dtype or self.dtype

    @property
    def radix_cache(self) -> bool:
        return not self.disable_radix_cache

    @property
    def overlap_schedule(self) -> bool:
        """Results are processed one step late. Not with no_buffer caching: it inserts the working state
        at finish, which the overlapped extra step of a finished request would already have advanced."""
        no_buffer_cache = self.radix_cache and self.mamba_radix_cache_strategy == "no_buffer"
        return not self.disable_overlap_schedule and not no_buffer_cache

    @property
    def tracking(self) -> bool:
        """Checkpoints are taken into ping-pong tracking slots (radix cache with the extra_buffer strategy)."""
        return self.radix_cache and self.mamba_radix_cache_strategy == "extra_buffer"

    @property
    def tokens_per_step(self) -> int:
        """The most tokens one decode/verify step commits per request."""
        return self.speculative_num_draft_tokens if self.speculative else 1

    def validate(self) -> None:
        """Raise ValueError naming the offending setting (SGLang's checks plus ours)."""
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices and not (value is None and f.default is None):
                raise ValueError(f"{f.name} must be one of {choices}, got {value!r}")
        for name in ("tp_size", "speculative_num_draft_tokens", "mamba_track_interval", "page_size",
                     "max_running_requests", "max_total_tokens", "chunked_prefill_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.mamba_track_interval % self.page_size != 0:
            raise ValueError(
                f"mamba_track_interval ({self.mamba_track_interval}) must be a multiple of "
                f"page_size ({self.page_size})"
            )
        if self.speculative and self.mamba_track_interval < self.speculative_num_draft_tokens:
            raise ValueError(
                f"mamba_track_interval ({self.mamba_track_interval}) must be >= "
                f"speculative_num_draft_tokens ({self.speculative_num_draft_tokens}): one verify step "
                "may cross at most one checkpoint boundary"
            )
        if self.tracking and self.overlap_schedule and self.mamba_track_interval < 2 * self.tokens_per_step:
            raise ValueError(
                f"mamba_track_interval ({self.mamba_track_interval}) must be >= 2 x {self.tokens_per_step} tokens per "
                "step with overlap scheduling: a step is prepared before the previous one's checkpoint is "
                "recorded, so two consecutive steps may not both cross a boundary (or use "
                "--disable-overlap-schedule)"
            )
        if self.tracking and self.chunked_prefill_size < max(64, self.page_size):
            raise ValueError(
                f"chunked_prefill_size ({self.chunked_prefill_size}) must be >= the mamba cache chunk size "
                f"max(64, page_size) = {max(64, self.page_size)}: a shorter extend never takes a checkpoint"
            )
        if self.mamba_radix_cache_strategy == "no_buffer" and self.page_size != 1:
            raise ValueError(f"mamba_radix_cache_strategy 'no_buffer' requires page_size 1, got {self.page_size}")
        if self.inject_fault is not None:
            from engine.faults import check_fault_name

            check_fault_name(self.inject_fault)

    def to_dict(self) -> dict:
        return asdict(self)
