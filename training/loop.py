"""What both training phases share: the learning-rate schedule, the optimiser, checkpoints and the step loop."""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from tqdm import tqdm


def lr_at(progress: float, tc) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr; progress in [0, 1]."""
    if progress < tc.warmup:
        return tc.lr * max(progress, 1e-3) / tc.warmup
    frac = min(1.0, (progress - tc.warmup) / max(1e-9, 1.0 - tc.warmup))
    return tc.lr * (tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(params: list[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float):
    """AdamW; weight decay on matrices only (not norms, gates, the conv or the tied embedding)."""
    decay = [p for n, p in params if p.dim() == 2 and "conv_weight" not in n and n != "embed.weight"]
    rest = [p for n, p in params if not (p.dim() == 2 and "conv_weight" not in n and n != "embed.weight")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def save_ckpt(path: Path, state: dict) -> None:
    """Write a checkpoint atomically: an interrupted save leaves the previous one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_ckpt(path: Path) -> dict | None:
    return torch.load(path, weights_only=False) if path.exists() else None


class StepLoop:
    """A phase's optimisation loop, checkpointable at any step.

    Subclasses set `module` (what is trained), `opt`, `tc` (a config with steps, lr, warmup,
    min_lr_ratio, grad_clip), `budget_s` and `desc`, and implement `loss()` for the current step.
    """

    module: torch.nn.Module
    opt: torch.optim.Optimizer
    desc = "train"

    def __init__(self) -> None:
        self.step = 0
        self.elapsed = 0.0  # seconds spent in training steps (survives resume)
        self.history: list[tuple[int, float]] = []  # (step, smoothed train loss)

    def progress(self) -> float:
        if self.tc.steps > 0:
            return self.step / self.tc.steps
        return self.elapsed / max(1.0, self.budget_s)

    def loss(self) -> torch.Tensor:
        raise NotImplementedError

    def after_step(self) -> dict:
        """Hook run after each step; returns extra progress-bar fields."""
        return {}

    def postfix(self, smooth: float, lr: float) -> dict:
        return {"step": self.step, "loss": f"{smooth:.3f}", "lr": f"{lr:.1e}"}

    def train(self, checkpoint, every_s: float = 60.0) -> None:
        """Run steps until the budget is spent, calling checkpoint(self) about every `every_s` seconds."""
        tc = self.tc
        self.module.train()
        total = tc.steps if tc.steps > 0 else round(self.budget_s)
        bar = tqdm(total=total, initial=min(total, self.step if tc.steps > 0 else round(self.elapsed)),
                   desc=self.desc, unit="step" if tc.steps > 0 else "s", dynamic_ncols=True)
        smooth = self.history[-1][1] if self.history else None
        last_ckpt = time.monotonic()
        extra: dict = {}
        while self.progress() < 1.0:
            t0 = time.monotonic()
            lr = lr_at(self.progress(), tc)
            for group in self.opt.param_groups:
                group["lr"] = lr
            loss = self.loss()
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), tc.grad_clip)
            self.opt.step()
            self.step += 1
            smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
            if self.step % 10 == 0:
                self.history.append((self.step, round(smooth, 4)))
            extra.update(self.after_step())
            self.elapsed += time.monotonic() - t0
            bar.update(1 if tc.steps > 0 else min(total, int(self.elapsed)) - bar.n)
            bar.set_postfix({**self.postfix(smooth, lr), **extra})
            if time.monotonic() - last_ckpt >= every_s:
                checkpoint(self)
                last_ckpt = time.monotonic()
        bar.close()
        self.module.eval()
