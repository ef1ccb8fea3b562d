"""EngineConfig: every engine setting, validated in one place (like SGLang's ServerArgs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

SPEC_ALGORITHMS = ("NONE", "DFLASH")
MAMBA_STRATEGIES = ("extra_buffer", "no_buffer")


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine replica. Names mirror SGLang's server flags."""

    model_path: str = "default"  # "default" (committed trained weights), "random", or a weights directory
    model_preset: str = "small"  # architecture used when model_path == "random"
    seed: int = 0
    tp_size: int = 1
    speculative_algorithm: str = "NONE"
    speculative_num_draft_tokens: int = 8  # DFlash block size B
    drafter_mode: str = "model"  # "model" or "scripted" (test aid, see engine/spec/scripted.py)
    scripted_accept: int = 0  # scripted mode: drafts that copy the target's greedy tokens per block
    mamba_radix_cache_strategy: str = "extra_buffer"
    mamba_track_interval: int = 256
    page_size: int = 16
    disable_radix_cache: bool = False
    max_running_requests: int = 16
    max_total_tokens: int = 65536  # KV pool capacity in tokens
    max_state_slots: int = 0  # linear-state pool slots; 0 = derived from max_running_requests
    chunked_prefill_size: int = 512
    inject_fault: str | None = None
    device: str = "cpu"
    force_torch_kernels: bool = False  # use torch references even on CUDA (A/B checks)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm == "DFLASH"

    @property
    def radix_cache(self) -> bool:
        return not self.disable_radix_cache

    def validate(self) -> None:
        """Raise ValueError naming the offending setting (SGLang's checks plus ours)."""
        if self.speculative_algorithm not in SPEC_ALGORITHMS:
            raise ValueError(
                f"speculative_algorithm must be one of {SPEC_ALGORITHMS}, got {self.speculative_algorithm!r}"
            )
        if self.mamba_radix_cache_strategy not in MAMBA_STRATEGIES:
            raise ValueError(
                f"mamba_radix_cache_strategy must be one of {MAMBA_STRATEGIES}, "
                f"got {self.mamba_radix_cache_strategy!r}"
            )
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
        if self.mamba_radix_cache_strategy == "no_buffer" and self.page_size != 1:
            raise ValueError(f"mamba_radix_cache_strategy 'no_buffer' requires page_size 1, got {self.page_size}")
        if self.drafter_mode not in ("model", "scripted"):
            raise ValueError(f"drafter_mode must be 'model' or 'scripted', got {self.drafter_mode!r}")
        if self.inject_fault is not None:
            from engine.faults import check_fault_name

            check_fault_name(self.inject_fault)

    def to_dict(self) -> dict:
        return asdict(self)
