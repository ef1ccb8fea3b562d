"""Distilling the DFlash drafter from the frozen target's greedy rollouts (as DFlash drafters are trained).

A training block is anchored at a generated position p of a rollout, as in serving, where the anchor is the
bonus token the last verify step (or the prefill) produced: ids [token_p, mask x (B - 1)] at positions p..p+B-1,
the context the target's features at positions < p, labels the target's greedy tokens p+1..p+B-1. Cross entropy
per block position i weighted by exp(-(i - 1) / gamma): a draft counts only if every earlier one was accepted.
The target's embedding and LM head are the drafter's, frozen. Torch only (the target's tensors are passed in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tests.sglang_setup.model.config import MASK_ID
from tests.sglang_setup.model.drafter import DFlashDrafter
from training.data import step_generator
from training.loop import StepLoop, make_optimizer


@dataclass(frozen=True)
class DrafterConfig:
    """Budget and optimiser of the drafter phase (a config StepLoop reads)."""

    minutes: float = 10.0  # used when steps == 0
    steps: int = 2500
    batch_size: int = 8  # rollouts per step
    anchors: int = 16  # blocks per rollout per step
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup: float = 0.03
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    decay_gamma: float = 5.0
    seed: int = 0


def block_weights(B: int, gamma: float) -> torch.Tensor:
    """[B - 1] loss weights of block positions 1..B-1: exp(-(i - 1) / gamma)."""
    return torch.tensor([math.exp(-(i - 1) / gamma) for i in range(1, B)])


class DrafterTrainer(StepLoop):
    """One step: `batch_size` rollouts, `anchors` blocks each, at random generated positions."""

    desc = "drafter"

    def __init__(self, drafter: DFlashDrafter, dc: DrafterConfig, rollouts, embed: torch.Tensor,
                 lm_head: torch.Tensor) -> None:
        super().__init__()
        self.module, self.tc, self.rollouts = drafter, dc, rollouts
        self.embed, self.lm_head = embed.detach(), lm_head.detach()
        self.budget_s = dc.minutes * 60
        self.weights = block_weights(drafter.block_size, dc.decay_gamma)
        self.opt = make_optimizer(list(drafter.named_parameters()), dc.lr, dc.weight_decay)

    def batch(self, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(rollout rows [N], anchors [N, A]) drawn for one step."""
        B, ro = self.module.block_size, self.rollouts
        rows = torch.randint(0, len(ro.ids), (self.tc.batch_size,), generator=gen)
        lo = ro.prompt_lens[rows]
        span = (ro.lengths[rows] - B + 1 - lo).clamp(min=1)  # the whole block inside the generated tokens
        anchors = lo[:, None] + (torch.rand(len(rows), self.tc.anchors, generator=gen) * span[:, None]).long()
        return rows, anchors

    def loss(self) -> torch.Tensor:
        gen = step_generator(self.tc.seed, self.step)
        rows, anchors = self.batch(gen)
        return block_loss(self.module, self.rollouts.ids[rows], self.rollouts.features[rows], anchors, self.embed,
                          self.lm_head, self.weights)


def block_loss(drafter: DFlashDrafter, ids: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor,
               embed: torch.Tensor, lm_head: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted cross entropy of the blocks anchored at `anchors` [N, A] of sequences ids [N, L]."""
    B = drafter.block_size
    offsets = torch.arange(B)
    positions = anchors[..., None] + offsets  # [N, A, B]
    block_ids = torch.full_like(positions, MASK_ID)
    block_ids[..., 0] = torch.gather(ids, 1, anchors)
    labels = torch.gather(ids, 1, positions.flatten(1)).view_as(positions)[..., 1:]  # [N, A, B - 1]
    hidden = drafter(features, embed[block_ids], anchors)  # [N, A, B, h]
    logits = hidden[..., 1:, :] @ lm_head.T
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return (ce.view_as(labels) * weights).sum() / (weights.sum() * labels.shape[0] * labels.shape[1])
