"""Phase 1 of `python -m training`: next-byte training of the hybrid target."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.config import HybridConfig
from engine.model.hybrid import HybridLM
from training.data import Corpus, fixed_windows, sample_windows, step_generator
from training.forward import target_forward
from training.loop import StepLoop, make_optimizer

LN2 = math.log(2.0)


@dataclass(frozen=True)
class TargetTrainConfig:
    """Budget and optimiser settings of the target phase (see `python -m training --help`)."""

    minutes: float = 17.0  # training-loop wall-time budget (used when steps == 0)
    steps: int = 0  # > 0: a fixed number of steps (fully reproducible), the schedule follows steps
    seq_len: int = 512
    batch_size: int = 4
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup: float = 0.03  # share of the budget spent warming up
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0


@torch.no_grad()
def init_for_training(model: HybridLM, seed: int) -> None:
    """GPT-style init: N(0, 0.02) matrices (residual outputs scaled down by depth), unit norms, GDN decays."""
    gen = torch.Generator().manual_seed(seed)
    depth_scale = 1.0 / math.sqrt(2 * model.cfg.num_layers)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif p.dim() == 2 and "conv_weight" not in name:
            std = 0.02 * (depth_scale if name.endswith(("o_proj.weight", "out_proj.weight", "down.weight")) else 1)
            p.normal_(0.0, std, generator=gen)
    for layer in model.layers:
        if not layer.is_attention:
            layer.mixer.init_weights(gen)


def lm_loss(model: HybridLM, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross entropy (nats) of windows ids [B, T]."""
    hidden, _ = target_forward(model, ids[:, :-1])
    logits = model.logits(hidden)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@torch.no_grad()
def bits_per_byte(model: HybridLM, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-byte loss in bits over windows [N, T] (every position after the first)."""
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        ids = windows[i : i + batch]
        n = ids[:, 1:].numel()
        total += lm_loss(model, ids).item() * n
        count += n
    return total / count / LN2


class TargetTrainer(StepLoop):
    """Owns the model, optimiser and progress of the target phase; checkpointable at any step."""

    desc = "target"

    def __init__(self, cfg: HybridConfig, tc: TargetTrainConfig, corpus: Corpus):
        super().__init__()
        self.cfg, self.tc, self.corpus = cfg, tc, corpus
        self.model = self.module = HybridLM(cfg)
        init_for_training(self.model, tc.seed)
        self.opt = make_optimizer(list(self.model.named_parameters()), tc.lr, tc.weight_decay)
        self.budget_s = tc.minutes * 60

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                "elapsed": self.elapsed, "history": self.history}

    def load_state_dict(self, st: dict) -> None:
        self.model.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.step, self.elapsed, self.history = st["step"], st["elapsed"], st["history"]

    def loss(self) -> torch.Tensor:
        tc = self.tc
        ids = sample_windows(self.corpus.train, tc.batch_size, tc.seq_len + 1, step_generator(tc.seed, self.step))
        return lm_loss(self.model, ids)

    def postfix(self, smooth: float, lr: float) -> dict:
        return {"step": self.step, "loss": f"{smooth:.3f}", "bpb": f"{smooth / LN2:.2f}", "lr": f"{lr:.1e}"}

    def validation_bpb(self, windows: int = 48) -> float:
        """Bits per byte on a fixed set of validation windows."""
        return bits_per_byte(self.model, fixed_windows(self.corpus.validation, windows, self.tc.seq_len + 1))


def bf16_rounded(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights as committed: rounded to bfloat16 (the loader casts them back to fp32)."""
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in state.items()}
