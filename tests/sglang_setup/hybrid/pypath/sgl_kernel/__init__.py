"""The hybrid setup's sgl_kernel: shadows the stand-in in tests/sglang_setup/standins (PYTHONPATH comes first).

Test and stretch setup only; the product never imports it.

Like the stand-in, unknown `*_cpu` names raise NotImplementedError when called and non-`*_cpu` names do not
exist; unlike it, the CPU ops of the hybrid (Gated DeltaNet) path are real torch implementations
(sgl_kernel/cpu_ops.py), readable rather than fast.
"""
from __future__ import annotations

import os
import sys

import torch

TRACE = os.environ.get("SPECGATE_HYBRID_TRACE_OPS") == "1"


class StandInOp:
    def __init__(self, name: str) -> None:
        self.__name__ = self.name = name
        self.default = self

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{self.name} was called: the hybrid setup's sgl_kernel has no such op")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in op {self.name}>"


class RealOp:
    def __init__(self, name, fn) -> None:
        self.__name__ = self.name = name
        self.fn = fn
        self.default = self
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if TRACE and self.calls <= 3:
            print(f"[hybrid sgl_kernel] {self.name} call {self.calls}", file=sys.stderr, flush=True)
        return self.fn(*args, **kwargs)


def _real():
    from sgl_kernel import cpu_ops
    return {n: RealOp(n, getattr(cpu_ops, n)) for n in cpu_ops.__all__}


_REAL = None


def _op(name: str):
    global _REAL
    if not name.endswith("_cpu"):
        raise AttributeError(f"sgl_kernel (hybrid setup): no {name!r}")
    if _REAL is None:
        _REAL = _real()
    return _REAL.get(name) or StandInOp(name)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _op(name)


class _OpsNamespace:
    name = "sgl_kernel"

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _op(name)


torch.ops.sgl_kernel = _OpsNamespace()
