"""HybridLM: the Qwen3-Next-style target model (3 Gated DeltaNet layers : 1 attention layer)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from engine.model.attention import Attention
from engine.model.batch import ForwardBatch
from engine.model.config import HybridConfig
from engine.model.gdn import GatedDeltaNet
from engine.model.layers import MLP, RMSNorm, linear
from engine.tp.group import SINGLE, TPContext


class DecoderLayer(nn.Module):
    def __init__(self, cfg: HybridConfig, layer: int, tp: TPContext):
        super().__init__()
        self.is_attention = cfg.is_full_attention(layer)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if self.is_attention:
            self.mixer = Attention(cfg, cfg.attention_layers.index(layer), tp)
        else:
            self.mixer = GatedDeltaNet(cfg, cfg.linear_layers.index(layer), tp)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, tp)

    def forward(self, x, fb, caches):
        if self.is_attention:
            i = self.mixer.attn_index
            h = self.mixer(self.input_norm(x), fb, caches.k[i], caches.v[i])
        else:
            i = self.mixer.gdn_index
            h = self.mixer(self.input_norm(x), fb, caches.rec[i], caches.conv[i])
        x = x + h
        return x + self.mlp(self.post_norm(x))


class HybridLM(nn.Module):
    """Embedding -> decoder layers -> RMSNorm; the LM head is the tied embedding."""

    def __init__(self, cfg: HybridConfig, tp: TPContext = SINGLE):
        super().__init__()
        self.cfg = cfg
        self.tp = tp
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)  # replicated on every rank
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, fb: ForwardBatch, caches) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Final hidden states [B, T, h] and, if fb.capture_layers, [B, T, len*h] of those layers."""
        x = self.embed(input_ids)
        captured = []
        for i, layer in enumerate(self.layers):
            x = layer(x, fb, caches)
            if i in fb.capture_layers:
                captured.append(x)
        aux = torch.cat(captured, dim=-1) if captured else None
        return self.norm(x), aux

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary (tied LM head), returned as fp32.

        The head runs in the weights' dtype, as GPU engines run it (vLLM, and SGLang without
        --enable-fp32-lm-head): in bf16 the logits are bf16 values, converted to fp32 for
        log-softmax and sampling. In fp32 it is the plain fp32 product.
        """
        w = self.embed.weight
        if w.dtype == torch.float32:
            return hidden.float() @ w.t()
        return linear(hidden.to(w.dtype), w).float()

    @torch.no_grad()
    def init_random(self, seed: int) -> None:
        """Seeded random weights (`--model-path random`), identical on every rank before sharding."""
        full = random_state_dict(self.cfg, seed)
        from engine.model.weights import load_full_state_dict

        load_full_state_dict(self, full)


@torch.no_grad()
def random_state_dict(cfg: HybridConfig, seed: int) -> dict[str, torch.Tensor]:
    """The full (unsharded) seeded random weights of a HybridLM."""
    gen = torch.Generator().manual_seed(seed)
    model = HybridLM(cfg)  # tp=1: full shapes
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name == "embed.weight":
            p.normal_(0.0, 1.0, generator=gen)
        elif p.dim() == 2 and "conv_weight" not in name:
            # fan-in scaled, so every layer moves the residual stream as much as the embedding
            # does: a random model whose tokens depend on its (linear and attention) state,
            # not one that echoes its input token
            gain = 4.0 if name.endswith(("o_proj.weight", "out_proj.weight", "down.weight")) else 1.0
            p.normal_(0.0, gain / math.sqrt(p.shape[1]), generator=gen)
    for layer in model.layers:
        if not layer.is_attention:
            layer.mixer.init_weights(gen)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
