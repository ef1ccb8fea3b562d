"""Weights on disk: a directory with `config.json` and `model.safetensors` (and `drafter.safetensors`)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from engine.model.config import HybridConfig


class WeightsError(ValueError):
    """A checkpoint does not match the model: names the missing, extra or mis-shaped tensors."""


def save_weights(directory: Path, cfg: HybridConfig, state: dict[str, torch.Tensor], name: str = "model") -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cfg.save(directory / "config.json")
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / f"{name}.safetensors"))


def load_config(directory: Path) -> HybridConfig:
    path = Path(directory) / "config.json"
    if not path.exists():
        raise WeightsError(f"{path} not found: a weights directory needs config.json and model.safetensors")
    return HybridConfig.load(path)


def load_state(directory: Path, name: str = "model") -> dict[str, torch.Tensor]:
    path = Path(directory) / f"{name}.safetensors"
    if not path.exists():
        raise WeightsError(f"{path} not found")
    return load_file(str(path))


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    mod_name, _, param = name.rpartition(".")
    return (model.get_submodule(mod_name) if mod_name else model), param


@torch.no_grad()
def load_full_state_dict(model: nn.Module, full: dict[str, torch.Tensor]) -> None:
    """Load a full (unsharded) checkpoint, each rank keeping only its shard.

    Fails with one message naming every missing, unexpected and mis-shaped tensor.
    """
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(full))
    extra = sorted(set(full) - set(params))
    local = {}
    bad = []
    for name in sorted(set(params) & set(full)):
        owner, pname = _owner(model, name)
        t = full[name]
        if hasattr(owner, "shard_full"):
            t = owner.shard_full(pname, t)
        if tuple(t.shape) != tuple(params[name].shape):
            bad.append(f"{name}: checkpoint {tuple(full[name].shape)}, model expects "
                       f"{tuple(params[name].shape)} (this rank's shard)")
        local[name] = t
    if missing or extra or bad:
        parts = []
        if missing:
            parts.append(f"missing tensors: {missing}")
        if extra:
            parts.append(f"unexpected tensors: {extra}")
        if bad:
            parts.append("mis-shaped tensors: " + "; ".join(bad))
        raise WeightsError("checkpoint does not match the model: " + " | ".join(parts))
    for name, t in local.items():
        params[name].copy_(t.to(params[name].dtype))
