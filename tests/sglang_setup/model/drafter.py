"""The DFlash drafter as SGLang computes it (models/dflash.py, speculative/dflash_worker_v2.py), in plain torch.

Written from SGLang's semantics, not its code; the parameter names are SGLang's checkpoint names, so
`state_dict()` is the drafter directory's model.safetensors. One draft step for a request whose first L tokens
are committed and whose bonus (anchor) token sits at position L:

* context: the target's features at positions 0..L-1 (the residual stream after each of `target_layer_ids`,
  concatenated) -> `fc` -> `hidden_norm`; each draft layer turns that into keys and values (k_proj, v_proj,
  k_norm, RoPE at the token's position; no input norm: SGLang's `kv_proj_only`);
* block: the target's embedding of [anchor, mask x (B - 1)] at positions L..L+B-1 through the layers (pre-norm
  attention over the context keys and the whole block, bidirectional: ENCODER_ONLY; SwiGLU MLP), `norm`;
* drafts: the target's LM head on block positions 1..B-1, greedy.

Training runs many blocks at once: blocks anchored at positions p_a of one sequence share its context keys, each
sees the context before its anchor and its own block only (`block_mask`). Torch only: the project's tests
import it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight, in fp32 (SGLang's RMSNorm; not Gemma's 1 + weight)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding over the whole head: x [..., T, H, D], positions [..., T]."""
    D = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D))
    ang = positions.float()[..., None] * inv_freq  # [..., T, D/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[..., None, :]  # [..., T, 1, D]: the heads share it
    sin = torch.cat([ang.sin(), ang.sin()], -1)[..., None, :]
    xf = x.float()
    rotated = torch.cat([-xf[..., D // 2:], xf[..., : D // 2]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class Norm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h, self.heads, self.kv_heads, self.head_dim = (cfg["hidden_size"], cfg["num_attention_heads"],
                                                      cfg["num_key_value_heads"], cfg["head_dim"])
        self.theta = cfg["rope_theta"]
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = Norm(self.head_dim, cfg["rms_norm_eps"])
        self.k_norm = Norm(self.head_dim, cfg["rms_norm_eps"])

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, T, h] -> keys (normed, rotated) and values [N, T, kv_heads, head_dim]."""
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.kv_heads, self.head_dim)))
        return rope(k, positions, self.theta), self.v_proj(x).unflatten(-1, (self.kv_heads, self.head_dim))

    def forward(self, x, positions, ctx_kv, mask) -> torch.Tensor:
        """x [N, Q, h] block tokens at `positions` [N, Q]; ctx_kv: context keys/values [N, C, kv_heads, D]; mask
        [N, Q, C + Q] (True: may attend)."""
        q = rope(self.q_norm(self.q_proj(x).unflatten(-1, (self.heads, self.head_dim))), positions, self.theta)
        k, v = self.keys_values(x, positions)
        keys, values = torch.cat([ctx_kv[0], k], 1), torch.cat([ctx_kv[1], v], 1)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             attn_mask=mask[:, None], scale=self.head_dim ** -0.5, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class Layer(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.input_layernorm = Norm(h, eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = Norm(h, eps)
        self.mlp = nn.ModuleDict({"gate_proj": nn.Linear(h, cfg["intermediate_size"], bias=False),
                                  "up_proj": nn.Linear(h, cfg["intermediate_size"], bias=False),
                                  "down_proj": nn.Linear(cfg["intermediate_size"], h, bias=False)})

    def forward(self, x, positions, ctx_kv, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_kv, mask)
        hidden = self.post_attention_layernorm(x)
        return x + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](hidden)) * self.mlp["up_proj"](hidden))


class DFlashDrafter(nn.Module):
    """fc, hidden_norm, layers.*, norm: a DFlashDraftModel's weights."""

    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h, features = cfg["hidden_size"], len(cfg["dflash_config"]["target_layer_ids"])
        self.cfg = cfg
        self.block_size = cfg["dflash_config"]["block_size"]
        self.fc = nn.Linear(features * h, h, bias=False)
        self.hidden_norm = Norm(h, cfg["rms_norm_eps"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = Norm(h, cfg["rms_norm_eps"])

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """N(0, 0.02) matrices, unit norms: a fresh drafter, seeded."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02, generator=gen)

    def forward(self, features: torch.Tensor, block_embeds: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """Hidden states of the blocks [N, A, B, h]. features [N, C, F*h]: the target's features of each
        sequence's first C tokens; block_embeds [N, A, B, h]: embeddings of [anchor, mask...]; anchors [N, A]:
        the anchors' positions (a block sees the context before its anchor)."""
        N, A, B, h = block_embeds.shape
        C = features.shape[1]
        ctx = self.hidden_norm(self.fc(features))  # [N, C, h]
        ctx_pos = torch.arange(C, device=ctx.device).expand(N, C)
        positions = (anchors[..., None] + torch.arange(B, device=anchors.device)).reshape(N, A * B)
        mask = block_mask(anchors, B, C)
        x = block_embeds.reshape(N, A * B, h)
        for layer in self.layers:
            ctx_kv = layer.self_attn.keys_values(ctx, ctx_pos)
            x = layer(x, positions, ctx_kv, mask)
        return self.norm(x).reshape(N, A, B, h)


def block_mask(anchors: torch.Tensor, B: int, C: int) -> torch.Tensor:
    """[N, A*B, C + A*B] bool: block a's tokens see context positions < anchors[a] and all of block a."""
    N, A = anchors.shape
    ctx = torch.arange(C, device=anchors.device)[None, None, :] < anchors[..., None]  # [N, A, C]
    ctx = ctx[:, :, None, :].expand(N, A, B, C).reshape(N, A * B, C)
    own = torch.eye(A, dtype=torch.bool, device=anchors.device).repeat_interleave(B, 0).repeat_interleave(B, 1)
    return torch.cat([ctx, own[None].expand(N, -1, -1)], dim=-1)


def draft_block(drafter: DFlashDrafter, features: torch.Tensor, anchor_token: int, embed: torch.Tensor,
                lm_head: torch.Tensor, mask_id: int) -> list[int]:
    """The B - 1 greedy drafts of one step: features [C, F*h] of the committed tokens, the anchor at position C."""
    B = drafter.block_size
    ids = torch.tensor([anchor_token] + [mask_id] * (B - 1))
    hidden = drafter(features[None], embed[ids][None, None], torch.tensor([[features.shape[0]]]))[0, 0]
    return (hidden[1:] @ lm_head.T).argmax(-1).tolist()
