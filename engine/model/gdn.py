"""Gated DeltaNet mixer, faithful to Qwen3-Next's linear-attention layer."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine import kernels
from engine.model.batch import ForwardBatch
from engine.model.config import HybridConfig
from engine.model.layers import ColumnParallelLinear, GatedRMSNorm, RowParallelLinear
from engine.tp.group import SINGLE, TPContext


class GatedDeltaNet(nn.Module):
    """conv(qkv) -> SiLU -> L2-norm q,k -> delta rule with gates -> gated RMSNorm -> out."""

    def __init__(self, cfg: HybridConfig, gdn_index: int, tp: TPContext = SINGLE):
        super().__init__()
        self.gdn_index = gdn_index  # index among GDN layers, into the state pool
        self.tp = tp
        self.hk = tp.shard(cfg.linear_num_key_heads, "linear_num_key_heads")
        self.hv = tp.shard(cfg.linear_num_value_heads, "linear_num_value_heads")
        self.dk, self.dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        kd, vd = cfg.linear_key_dim, cfg.linear_value_dim
        self.conv_splits = [kd, kd, vd]
        self.in_proj_qkvz = ColumnParallelLinear(cfg.hidden_size, [kd, kd, vd, vd], tp)
        self.in_proj_ba = ColumnParallelLinear(cfg.hidden_size, [cfg.linear_num_value_heads] * 2, tp)
        conv_local = self.hk * self.dk * 2 + self.hv * self.dv
        self.conv_weight = nn.Parameter(torch.empty(conv_local, cfg.linear_conv_kernel_dim))
        self.A_log = nn.Parameter(torch.empty(self.hv))
        self.dt_bias = nn.Parameter(torch.empty(self.hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = RowParallelLinear(vd, cfg.hidden_size, tp)
        self.scale = 1.0 / math.sqrt(self.dk)

    def shard_full(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full GDN-owned parameter (heads split across ranks)."""
        r, n = self.tp.rank, self.tp.size
        if name in ("A_log", "dt_bias"):
            return full.chunk(n)[r]
        if name == "conv_weight":
            parts, off = [], 0
            for s in self.conv_splits:
                parts.append(full[off : off + s].chunk(n)[r])
                off += s
            return torch.cat(parts)
        return full

    def forward(self, x: torch.Tensor, fb: ForwardBatch, rec_pool: torch.Tensor, conv_pool: torch.Tensor):
        conv_inter = fb.conv_inter[self.gdn_index] if fb.verify else None
        rec_inter = fb.rec_inter[self.gdn_index] if fb.verify else None
        return self.mix(
            x,
            lambda mixed: kernels.conv_pool_forward(mixed, conv_pool, fb.state_slots, self.conv_weight, conv_inter,
                                                    fb.track_slots, fb.track_offsets),
            lambda q, k, v, g, beta: kernels.gdn_pool_forward(q, k, v, g, beta, rec_pool, fb.state_slots,
                                                              self.scale, rec_inter, fb.track_slots,
                                                              fb.track_offsets),
        )

    def mix(self, x: torch.Tensor, conv, delta) -> torch.Tensor:
        """The layer's math around its two stateful ops, shared by serving and training.

        conv(mixed [B, T, C]) -> SiLU(conv); delta(q, k, v, g, beta) -> o [B, T, Hv, Dv].
        """
        B, T, _ = x.shape
        kd_l, vd_l = self.hk * self.dk, self.hv * self.dv
        qkvz = self.in_proj_qkvz(x)
        z = qkvz[..., 2 * kd_l + vd_l :]
        b, a = self.in_proj_ba(x).chunk(2, dim=-1)  # [B, T, Hv] each
        mixed = conv(qkvz[..., : 2 * kd_l + vd_l])  # [B, T, C]: q, k, v side by side already
        q, k, v = mixed.split([kd_l, kd_l, vd_l], dim=-1)
        q = F.normalize(q.reshape(B, T, self.hk, self.dk).float(), dim=-1)
        k = F.normalize(k.reshape(B, T, self.hk, self.dk).float(), dim=-1)
        rep = self.hv // self.hk
        # each key head serves `rep` value heads (repeat_interleave's layout, as an expand: fewer ops)
        q = q[:, :, :, None].expand(B, T, self.hk, rep, self.dk).reshape(B, T, self.hv, self.dk)
        k = k[:, :, :, None].expand(B, T, self.hk, rep, self.dk).reshape(B, T, self.hv, self.dk)  # [B, T, Hv, Dk]
        v = v.reshape(B, T, self.hv, self.dv)
        beta = torch.sigmoid(b.float())
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        o = delta(q, k, v.float(), g, beta)
        o = self.norm(o.to(x.dtype), z.reshape(B, T, self.hv, self.dv))
        return self.out_proj(o.reshape(B, T, vd_l))

    @torch.no_grad()
    def init_weights(self, gen: torch.Generator) -> None:
        """Qwen3-Next-like init: decays spread over [1, 16], dt in [1e-3, 1e-1]."""
        K = self.conv_weight.shape[1]
        self.conv_weight.uniform_(-1 / math.sqrt(K), 1 / math.sqrt(K), generator=gen)
        self.A_log.copy_(torch.empty(self.hv).uniform_(1, 16, generator=gen).log())
        dt = torch.exp(torch.empty(self.hv).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
