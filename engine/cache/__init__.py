"""Caches: paged KV pool, linear-state pool, radix tree with checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.cache.kv_pool import KVPool
from engine.cache.state_pool import StatePool
from engine.model.config import HybridConfig
from engine.tp.group import SINGLE, TPContext


@dataclass
class ModelCaches:
    """The two pools one rank's model reads and writes (its shard of the heads)."""

    kv: KVPool
    state: StatePool

    @property
    def k(self):
        return self.kv.k

    @property
    def v(self):
        return self.kv.v

    @property
    def rec(self):
        return self.state.rec

    @property
    def conv(self):
        return self.state.conv

    @classmethod
    def build(cls, cfg: HybridConfig, num_pages: int, page_size: int, num_state_slots: int,
              tp: TPContext = SINGLE, device="cpu", ssm_dtype: torch.dtype = torch.float32,
              dtype: torch.dtype = torch.float32) -> ModelCaches:
        """Pools sized for this rank's share of the heads; recurrent states stored in `ssm_dtype`, the KV and
        the conv windows in the activation dtype `dtype`."""
        kv = KVPool(len(cfg.attention_layers), num_pages, page_size,
                    tp.shard(cfg.num_key_value_heads, "num_key_value_heads"), cfg.head_dim, dtype=dtype,
                    device=device)
        conv_dim = (2 * tp.shard(cfg.linear_num_key_heads, "linear_num_key_heads") * cfg.linear_key_head_dim
                    + tp.shard(cfg.linear_num_value_heads, "linear_num_value_heads") * cfg.linear_value_head_dim)
        state = StatePool(len(cfg.linear_layers), num_state_slots,
                          tp.shard(cfg.linear_num_value_heads, "linear_num_value_heads"),
                          cfg.linear_key_head_dim, cfg.linear_value_head_dim, conv_dim,
                          cfg.linear_conv_kernel_dim, device=device, ssm_dtype=ssm_dtype, conv_dtype=dtype)
        return cls(kv, state)


__all__ = ["KVPool", "ModelCaches", "StatePool"]
