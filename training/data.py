"""Training text: the stdlib files outside the held-out split, divided into train and validation.

The held-out files (`workloads.corpus.is_heldout`) are where workload prompts
come from; they never enter training. Generated codec tables (gencodec.py
output: kilobytes of near-identical mapping lines) are left out as well, as
they are from the prompts. The rest are split by a second stable
hash of the relpath, so the split does not depend on the file order or on the
local Python version beyond which files exist.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from workloads.corpus import GENERATED_MARK, HEADER, is_heldout, stdlib_files

VALIDATION_PERCENT = 3


def is_validation(relpath: str) -> bool:
    """True for ~3% of the non-held-out files, kept for validation (a hash independent of is_heldout's)."""
    digest = hashlib.sha256(b"specgate-validation:" + relpath.encode("utf-8")).hexdigest()
    return int(digest[:8], 16) % 100 < VALIDATION_PERCENT


@dataclass(frozen=True)
class Corpus:
    """Train and validation text as byte tensors; each file after a `# file: relpath` line, as in heldout.txt."""

    train: torch.Tensor  # [n_train_bytes] uint8
    validation: torch.Tensor  # [n_val_bytes] uint8
    train_files: int
    validation_files: int
    heldout_files: int
    generated_files: int = 0  # codec tables left out


def load_corpus() -> Corpus:
    """Read this Python's stdlib and split it: held-out files dropped, the rest train / validation."""
    train, val = bytearray(), bytearray()
    n_train = n_val = n_held = n_gen = 0
    for rel, path in stdlib_files():
        if is_heldout(rel):
            n_held += 1
            continue
        body = path.read_bytes().replace(b"\r\n", b"\n")
        if GENERATED_MARK.encode("ascii") in body:
            n_gen += 1
            continue
        if not body.endswith(b"\n"):
            body += b"\n"
        chunk = f"{HEADER}{rel}\n".encode("ascii") + body
        if is_validation(rel):
            val += chunk
            n_val += 1
        else:
            train += chunk
            n_train += 1
    if not train or not val:
        raise RuntimeError("no stdlib source found for training (sysconfig stdlib path empty?)")
    return Corpus(torch.frombuffer(train, dtype=torch.uint8).clone(),
                  torch.frombuffer(val, dtype=torch.uint8).clone(), n_train, n_val, n_held, n_gen)


def sample_windows(text: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """[batch, length] long: windows of `text` at uniformly random starts."""
    starts = torch.randint(0, len(text) - length, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(length)
    return text[idx].long()


def step_generator(seed: int, step: int) -> torch.Generator:
    """The RNG of one training step: the batch of step s is the same after a resume."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def fixed_windows(text: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """[count, length] long: evenly spaced windows over `text` (a deterministic evaluation set)."""
    count = max(1, min(count, len(text) // length))
    stride = (len(text) - length) // count
    idx = (torch.arange(count) * stride)[:, None] + torch.arange(length)
    return text[idx].long()
