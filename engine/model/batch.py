"""ForwardBatch: where a model forward reads and writes its caches."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    """Cache addressing for B sequences that each contribute T new tokens.

    Prefill chunks run with B = 1; decode (T = 1) and verify (T = block size)
    batch many sequences.
    """

    positions: torch.Tensor  # [B, T] absolute position of each new token
    kv_write: torch.Tensor  # [B, T] KV-pool slot receiving each new token's K/V
    kv_read: torch.Tensor  # [B, Lk] KV-pool slots of positions 0..Lk-1 (padded with 0)
    kv_lens: torch.Tensor  # [B] valid keys per sequence (its length after this forward)
    state_slots: torch.Tensor  # [B] linear-state pool slot (working slot) of each sequence
    rec_inter: torch.Tensor | None = None  # verify: [L_gdn, B, T, H, Dk, Dv] every step's state
    conv_inter: torch.Tensor | None = None  # verify: [L_gdn, B, T, C, K-1]
    # extend: a prefill checkpoint per sequence, the state after track_offsets[b] of its new tokens
    track_slots: torch.Tensor | None = None  # [B] state-pool slot receiving it
    track_offsets: torch.Tensor | None = None  # [B] -1 for none
    capture_layers: tuple[int, ...] = ()  # layers whose output hidden states the drafter needs

    @property
    def verify(self) -> bool:
        return self.rec_inter is not None
