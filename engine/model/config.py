"""HybridConfig: a Qwen3-Next-style hybrid model (Gated DeltaNet + full attention)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from protocol.tokenizer import VOCAB_SIZE


@dataclass(frozen=True)
class HybridConfig:
    """Architecture of the target model and its DFlash drafter."""

    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 256
    num_layers: int = 8
    full_attention_interval: int = 4  # layer i is full attention when (i + 1) % interval == 0
    intermediate_size: int = 768
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 2048
    # full attention (grouped-query, RoPE)
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    rope_theta: float = 10000.0
    # Gated DeltaNet
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 64
    linear_value_head_dim: int = 64
    linear_conv_kernel_dim: int = 4
    # DFlash drafter
    drafter_num_layers: int = 1
    drafter_target_layers: tuple[int, ...] = (1, 4, 6)  # target layers whose hidden states feed the drafter

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        bad = [i for i in self.drafter_target_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"drafter_target_layers {bad} outside 0..{self.num_layers - 1}")
        object.__setattr__(self, "drafter_target_layers", tuple(self.drafter_target_layers))

    def is_full_attention(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval == 0

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_full_attention(i)]

    @property
    def linear_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if not self.is_full_attention(i)]

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v concatenated."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    def to_dict(self) -> dict:
        d = asdict(self)
        d["drafter_target_layers"] = list(self.drafter_target_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> HybridConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown HybridConfig fields: {unknown}")
        return cls(**d)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> HybridConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))


PRESETS: dict[str, HybridConfig] = {
    # fast tests: 3 GDN layers + 1 attention layer
    "tiny": HybridConfig(
        hidden_size=64, num_layers=4, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
        head_dim=32, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, drafter_num_layers=1, drafter_target_layers=(0, 2),
    ),
    # the built-in engine's default: ~6.8M parameters, 6 GDN + 2 attention layers
    "small": HybridConfig(),
}


def preset(name: str) -> HybridConfig:
    """The named architecture; a clear error lists the valid names."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid: {sorted(PRESETS)}")
    return PRESETS[name]
