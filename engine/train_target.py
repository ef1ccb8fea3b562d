"""Phase 1 of `python -m engine.train`: next-byte training of the hybrid target."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from engine.model.config import HybridConfig
from engine.model.hybrid import HybridLM
from engine.train_data import Corpus, fixed_windows, sample_windows, step_generator
from engine.train_model import target_forward

LN2 = math.log(2.0)


@dataclass(frozen=True)
class TargetTrainConfig:
    """Budget and optimiser settings of the target phase (see `python -m engine.train --help`)."""

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


def lr_at(progress: float, tc) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr; progress in [0, 1]."""
    if progress < tc.warmup:
        return tc.lr * max(progress, 1e-3) / tc.warmup
    frac = min(1.0, (progress - tc.warmup) / max(1e-9, 1.0 - tc.warmup))
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


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


def make_optimizer(params: list[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float):
    """AdamW; weight decay on matrices only (not norms, gates, the conv or the tied embedding)."""
    decay = [p for n, p in params if p.dim() == 2 and "conv_weight" not in n and n != "embed.weight"]
    rest = [p for n, p in params if not (p.dim() == 2 and "conv_weight" not in n and n != "embed.weight")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


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


class TargetTrainer:
    """Owns the model, optimiser and progress of the target phase; checkpointable at any step."""

    def __init__(self, cfg: HybridConfig, tc: TargetTrainConfig, corpus: Corpus):
        self.cfg, self.tc, self.corpus = cfg, tc, corpus
        self.model = HybridLM(cfg)
        init_for_training(self.model, tc.seed)
        self.opt = make_optimizer(list(self.model.named_parameters()), tc.lr, tc.weight_decay)
        self.step = 0
        self.elapsed = 0.0  # seconds spent in training steps (survives resume)
        self.history: list[tuple[int, float]] = []  # (step, smoothed train loss)

    def progress(self) -> float:
        if self.tc.steps > 0:
            return self.step / self.tc.steps
        return self.elapsed / (self.tc.minutes * 60)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                "elapsed": self.elapsed, "history": self.history}

    def load_state_dict(self, st: dict) -> None:
        self.model.load_state_dict(st["model"])
        self.opt.load_state_dict(st["opt"])
        self.step, self.elapsed, self.history = st["step"], st["elapsed"], st["history"]

    def train(self, checkpoint, every_s: float = 60.0) -> None:
        """Run steps until the budget is spent, calling checkpoint(self) about every `every_s` seconds."""
        tc = self.tc
        self.model.train()
        total = tc.steps if tc.steps > 0 else round(tc.minutes * 60)
        bar = tqdm(total=total, initial=min(total, self.step if tc.steps > 0 else round(self.elapsed)),
                   desc="target", unit="step" if tc.steps > 0 else "s", dynamic_ncols=True)
        smooth = self.history[-1][1] if self.history else None
        last_ckpt = time.monotonic()
        while self.progress() < 1.0:
            t0 = time.monotonic()
            lr = lr_at(self.progress(), tc)
            for group in self.opt.param_groups:
                group["lr"] = lr
            ids = sample_windows(self.corpus.train, tc.batch_size, tc.seq_len + 1, step_generator(tc.seed, self.step))
            loss = lm_loss(self.model, ids)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
            self.opt.step()
            self.step += 1
            dt = time.monotonic() - t0
            self.elapsed += dt
            smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
            if self.step % 10 == 0:
                self.history.append((self.step, round(smooth, 4)))
            bar.update(1 if tc.steps > 0 else min(total, int(self.elapsed)) - bar.n)
            bar.set_postfix({"step": self.step, "loss": f"{smooth:.3f}", "bpb": f"{smooth / LN2:.2f}",
                             "lr": f"{lr:.1e}"})
            if time.monotonic() - last_ckpt >= every_s:
                checkpoint(self)
                last_ckpt = time.monotonic()
        bar.close()
        self.model.eval()

    def validation_bpb(self, windows: int = 48) -> float:
        """Bits per byte on a fixed set of validation windows."""
        return bits_per_byte(self.model, fixed_windows(self.corpus.validation, windows, self.tc.seq_len + 1))


def bf16_rounded(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights as committed: rounded to bfloat16 (the loader casts them back to fp32)."""
    return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in state.items()}
