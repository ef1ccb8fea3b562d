"""Full attention: grouped-query heads, RoPE, paged KV."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.model.batch import ForwardBatch
from engine.model.config import HybridConfig
from engine.model.layers import ColumnParallelLinear, RowParallelLinear, rope
from engine.tp.group import SINGLE, TPContext


def gather_kv(pool: torch.Tensor, kv_read: torch.Tensor) -> torch.Tensor:
    """[N, Hkv, D] pool rows at kv_read [B, Lk] -> [B, Lk, Hkv, D]."""
    B, Lk = kv_read.shape  # index_select: the same rows as pool[kv_read], with less per-op work
    return pool.index_select(0, kv_read.reshape(-1)).view(B, Lk, *pool.shape[1:])


def causal_mask(positions: torch.Tensor, kv_lens: torch.Tensor, Lk: int) -> torch.Tensor:
    """[B, 1, T, Lk] True where query at `positions` may attend key position j."""
    j = torch.arange(Lk, device=positions.device)
    ok = (j[None, None, :] <= positions[:, :, None]) & (j[None, None, :] < kv_lens[:, None, None])
    return ok[:, None]


class Attention(nn.Module):
    def __init__(self, cfg: HybridConfig, attn_index: int, tp: TPContext = SINGLE):
        super().__init__()
        self.attn_index = attn_index  # index among attention layers, into the KV pool
        self.h = tp.shard(cfg.num_attention_heads, "num_attention_heads")
        self.hkv = tp.shard(cfg.num_key_value_heads, "num_key_value_heads")
        self.d = cfg.head_dim
        self.theta = cfg.rope_theta
        q_full, kv_full = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        self.qkv = ColumnParallelLinear(cfg.hidden_size, [q_full, kv_full, kv_full], tp)
        self.o_proj = RowParallelLinear(q_full, cfg.hidden_size, tp)

    def forward(self, x: torch.Tensor, fb: ForwardBatch, k_pool: torch.Tensor, v_pool: torch.Tensor):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = rope(q.reshape(B, T, self.h, self.d), fb.positions, self.theta)
        k = rope(k.reshape(B, T, self.hkv, self.d), fb.positions, self.theta)
        v = v.reshape(B, T, self.hkv, self.d)
        write = fb.kv_write.reshape(-1)  # distinct slots: index_copy_ is pool[write] = ..., with less per-op work
        k_pool.index_copy_(0, write, k.reshape(-1, self.hkv, self.d).to(k_pool.dtype))
        v_pool.index_copy_(0, write, v.reshape(-1, self.hkv, self.d).to(v_pool.dtype))
        K = gather_kv(k_pool, fb.kv_read).to(q.dtype)  # [B, Lk, Hkv, D]
        V = gather_kv(v_pool, fb.kv_read).to(q.dtype)
        mask = causal_mask(fb.positions, fb.kv_lens, K.shape[1])
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2), attn_mask=mask,
            enable_gqa=self.h != self.hkv,
        )  # [B, H, T, D]
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.h * self.d))
