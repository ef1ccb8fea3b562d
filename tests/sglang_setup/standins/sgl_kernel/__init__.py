"""A STAND-IN for `sgl_kernel`, SGLang's kernel package, for specgate's test setup only: it computes nothing.

Why it exists: SGLang's CPU path imports the CPU build of sgl-kernel unconditionally
(`from sgl_kernel import copy_all_layer_kv_cache_cpu` in sglang/kernels/ops/kvcache/cache_move.py, and
`torch.ops.sgl_kernel.*` lookups), and that build is not published; the registry's `sglang-kernel` holds
GPU ops only (shared/reference/sglang-cpu.md). A tiny Llama served with `--attention-backend torch_native`
calls none of these ops, so their names are all SGLang needs to start.

What it does:
- `from sgl_kernel import NAME_cpu` (and `from sgl_kernel.mamba import NAME_cpu`, where the hybrid models' conv
  and gated-delta-rule kernels live) gives a function that raises NotImplementedError when called; any other
  name is an ImportError, as for a kernel package built without it.
- `torch.ops.sgl_kernel` becomes a namespace that answers only `*_cpu` names (the same raising functions), so
  SGLang's `hasattr(torch.ops.sgl_kernel, "convert_weight_packed")`-style probes for GPU or AMX ops stay
  False and it takes its torch paths.
`make sglang` installs it into .venv-sglang (tests/sglang_setup/venv.py); specgate's own packages never
import it (tests/sglang_setup/test_standins.py checks that).
"""

from __future__ import annotations

import torch

from sgl_kernel._standin import DIST, VERSION

__all__ = ["DIST", "VERSION"]


class StandInOp:
    """A named kernel entry point that raises when called: a stand-in must never be mistaken for a result."""

    def __init__(self, name: str) -> None:
        self.__name__ = self.name = name
        self.default = self  # `torch.ops.sgl_kernel.NAME.default`, the overload torch.ops code reaches for

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{self.name} was called, but this sgl_kernel is specgate's import stand-in "
            "(tests/sglang_setup/standins/sgl_kernel): the CPU build of sgl-kernel is not published, so no CPU "
            "kernel exists here. The served model took a path that needs it; a text model with "
            "--attention-backend torch_native does not.")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in op {self.name}>"


def _op(name: str) -> StandInOp:
    if not name.endswith("_cpu"):
        raise AttributeError(f"sgl_kernel stand-in: no {name!r} (only *_cpu names exist, and they raise "
                             "NotImplementedError when called)")
    return StandInOp(name)


def __getattr__(name: str) -> StandInOp:
    if name.startswith("__"):
        raise AttributeError(name)
    return _op(name)


class _OpsNamespace:
    """`torch.ops.sgl_kernel`: only `*_cpu` names resolve, so probes for any other op see it missing."""

    name = "sgl_kernel"

    def __getattr__(self, name: str) -> StandInOp:
        if name.startswith("__"):
            raise AttributeError(name)
        return _op(name)


torch.ops.sgl_kernel = _OpsNamespace()
