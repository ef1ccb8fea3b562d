"""Differentiable full-sequence forwards of HybridLM and DFlashDrafter, for training.

They reuse the serving modules' parameters (same names, same math) but need no
paged pools: every sequence starts from zero linear states, the Gated DeltaNet
runs in the chunked form of engine/kernels/gdn_chunk.py (the same function serving
uses for prefill), the conv is a depthwise conv1d and attention is plain causal SDPA. A test checks that
the logits match the engine's inference path, so training and serving agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.kernels.gdn_chunk import gdn_chunk
from engine.model.attention import Attention
from engine.model.drafter import DFlashDrafter, DrafterLayer
from engine.model.gdn import GatedDeltaNet
from engine.model.hybrid import HybridLM
from engine.model.layers import rope


def causal_conv_train(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SiLU(depthwise causal conv) of x [B, T, C] from a zero window, as gdn_naive.causal_conv1d, via conv1d."""
    K = weight.shape[1]
    y = F.conv1d(F.pad(x.transpose(1, 2), (K - 1, 0)), weight[:, None, :].to(x.dtype), groups=x.shape[-1])
    return F.silu(y).transpose(1, 2)


def gdn_train_forward(m: GatedDeltaNet, x: torch.Tensor, chunk_size: int = 32) -> torch.Tensor:
    """GatedDeltaNet.forward for whole sequences x [B, T, h] from zero conv and recurrent states."""
    return m.mix(x, lambda mixed: causal_conv_train(mixed, m.conv_weight),
                 lambda q, k, v, g, beta: gdn_chunk(q, k, v, g, beta, None, m.scale, chunk_size)[0])

def attention_train_forward(m: Attention, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Attention.forward for whole sequences x [B, T, h] (positions [B, T]) with a causal mask."""
    B, T, _ = x.shape
    q, k, v = m.qkv(x).split([m.h * m.d, m.hkv * m.d, m.hkv * m.d], dim=-1)
    q = rope(q.reshape(B, T, m.h, m.d), positions, m.theta)
    k = rope(k.reshape(B, T, m.hkv, m.d), positions, m.theta)
    v = v.reshape(B, T, m.hkv, m.d)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         enable_gqa=m.h != m.hkv)  # [B, H, T, D]
    return m.o_proj(out.transpose(1, 2).reshape(B, T, m.h * m.d))


def target_forward(model: HybridLM, ids: torch.Tensor,
                   capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Final hidden states [B, T, h] of sequences ids [B, T] starting at position 0, and the captured
    layers' outputs concatenated [B, T, len(capture) * h] (None without capture), like HybridLM.forward."""
    B, T = ids.shape
    positions = torch.arange(T, device=ids.device).expand(B, T)
    x = model.embed(ids)
    captured = []
    for i, layer in enumerate(model.layers):
        h = layer.input_norm(x)
        if layer.is_attention:
            h = attention_train_forward(layer.mixer, h, positions)
        else:
            h = gdn_train_forward(layer.mixer, h)
        x = x + h
        x = x + layer.mlp(layer.post_norm(x))
        if i in capture:
            captured.append(x)
    aux = torch.cat(captured, dim=-1) if captured else None
    return model.norm(x), aux


def drafter_layer_train_forward(layer: DrafterLayer, x: torch.Tensor, positions: torch.Tensor,
                                ctx_k: torch.Tensor, ctx_v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """DrafterLayer.forward with an explicit mask [B, Q, Lc + Q] over [context ; block tokens]."""
    B, Q, _ = x.shape
    hq = layer.input_norm(x)
    q = rope(layer.q_proj(hq).reshape(B, Q, layer.h, layer.d), positions, layer.theta)
    kb, vb = layer.kv(hq, positions)
    K, V = torch.cat([ctx_k, kb], 1), torch.cat([ctx_v, vb], 1)  # [B, Lc + Q, Hkv, D]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2),
                                         attn_mask=mask[:, None], enable_gqa=layer.h != layer.hkv)
    x = x + layer.o_proj(out.transpose(1, 2).reshape(B, Q, layer.h * layer.d))
    return x + layer.mlp(layer.post_norm(x))


def block_mask(anchors: torch.Tensor, block_size: int, ctx_len: int) -> torch.Tensor:
    """[B, N*bs, ctx_len + N*bs] bool: block n sees context positions < anchors[:, n] and all of its own block."""
    B, N = anchors.shape
    Q = N * block_size
    blk = torch.arange(Q, device=anchors.device) // block_size  # block of each query / block key
    anchor_q = anchors.repeat_interleave(block_size, dim=1)  # [B, Q]
    ctx_ok = torch.arange(ctx_len, device=anchors.device)[None, None, :] < anchor_q[:, :, None]
    own = (blk[:, None] == blk[None, :]).expand(B, Q, Q)
    return torch.cat([ctx_ok, own], dim=-1)


def drafter_train_forward(drafter: DFlashDrafter, embed: torch.nn.Embedding, aux: torch.Tensor,
                          block_ids: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Hidden states [B, N, bs, h] of N blocks per sequence drafted in one forward.

    aux [B, L, n*h]: the target's captured hidden states of each sequence (positions 0..L-1);
    block_ids [B, N, bs]: `[anchor, MASK ...]` per block, block n at positions anchors[:, n] + arange(bs),
    attending to context positions < anchors[:, n] (the committed prefix) and its own block.
    """
    B, N, bs = block_ids.shape
    L = aux.shape[1]
    ctx_pos = torch.arange(L, device=aux.device).expand(B, L)
    ctx = drafter.context_kv(aux, ctx_pos)
    positions = (anchors[:, :, None] + torch.arange(bs, device=aux.device)).reshape(B, N * bs)
    mask = block_mask(anchors, bs, L)
    x = embed(block_ids.reshape(B, N * bs))
    for layer, (ck, cv) in zip(drafter.layers, ctx, strict=True):
        x = drafter_layer_train_forward(layer, x, positions, ck, cv, mask)
    return drafter.norm(x).reshape(B, N, bs, -1)
