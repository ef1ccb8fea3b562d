"""DFlash drafter: drafts a whole block in one forward, conditioned on the target's hidden states.

The block is `[anchor, MASK x (B-1)]` at positions `prefix_len + arange(B)`.
Each drafter layer's queries come from the block; its keys and values come
from `[context ; block]`, where the context is
`RMSNorm(fc(concat(target hidden states of chosen layers)))` for every committed
position, projected by that layer's own k/v projections and cached (only
committed positions ever enter the cache). Attention is non-causal inside the
block. The embedding and LM head are the target's. The drafter is replicated on
every tensor-parallel rank (it is small).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine.model.config import HybridConfig
from engine.model.layers import MLP, Linear, RMSNorm, rope


class DrafterLayer(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.h, self.hkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.theta = cfg.rope_theta
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.q_proj = Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.k_proj = Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.v_proj = Linear(cfg.hidden_size, self.hkv * self.d, bias=False)
        self.o_proj = Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K (with RoPE) and V of features x [B, T, h] -> [B, T, Hkv, D] each."""
        B, T, _ = x.shape
        k = rope(self.k_proj(x).reshape(B, T, self.hkv, self.d), positions, self.theta)
        return k, self.v_proj(x).reshape(B, T, self.hkv, self.d)

    def forward(self, x, positions, ctx_k, ctx_v, ctx_lens):
        B, T, _ = x.shape
        hq = self.input_norm(x)
        q = rope(self.q_proj(hq).reshape(B, T, self.h, self.d), positions, self.theta)
        kb, vb = self.kv(hq, positions)
        K, V = torch.cat([ctx_k, kb], 1), torch.cat([ctx_v, vb], 1)  # [B, Lc + T, Hkv, D]
        Lc = ctx_k.shape[1]
        ctx_ok = torch.arange(Lc, device=x.device)[None, :] < ctx_lens[:, None]  # [B, Lc]
        block = torch.ones(B, T, dtype=torch.bool, device=x.device)  # the block attends non-causally
        mask = torch.cat([ctx_ok, block], 1)[:, None, None, :]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2),
                                             attn_mask=mask, enable_gqa=self.h != self.hkv)
        x = x + self.o_proj(out.transpose(1, 2).reshape(B, T, self.h * self.d))
        return x + self.mlp(self.post_norm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = Linear(len(cfg.drafter_target_layers) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.ctx_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.drafter_num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def context_kv(self, aux: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per drafter layer, K/V of committed positions from target hidden states aux [B, T, n*h]."""
        c = self.ctx_norm(self.fc(aux))
        return [layer.kv(c, positions) for layer in self.layers]

    def forward(self, embed: nn.Embedding, block_ids, positions, ctx: list, ctx_lens) -> torch.Tensor:
        """Hidden states [B, T, h] of the block; ctx[l] = (K, V) [B, Lc, Hkv, D] gathered from the cache."""
        x = embed(block_ids)
        for layer, (ck, cv) in zip(self.layers, ctx, strict=True):
            x = layer(x, positions, ck, cv, ctx_lens)
        return self.norm(x)


@torch.no_grad()
def random_drafter_state_dict(cfg: HybridConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    d = DFlashDrafter(cfg)
    std = 0.02
    for name, p in d.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            p.normal_(0.0, std / (math.sqrt(2 * cfg.drafter_num_layers) if "o_proj" in name or "down" in name else 1),
                      generator=gen)
    return {k: v.detach().clone() for k, v in d.state_dict().items()}
