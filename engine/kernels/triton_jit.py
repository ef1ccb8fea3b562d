"""What the Triton kernels share: building them for the interpreter without CUDA, a reduction, slot checks.

Without a CUDA device the kernels are built for Triton's interpreter, which runs
them on CPU tensors (how the tests exercise them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Triton reads TRITON_INTERPRET when a function is decorated, not when it runs. On a
# machine without CUDA the interpreter is the only way the kernels can run at all, so
# build them for it even if the variable was not set before this module was imported.
INTERPRET = bool(triton.knobs.runtime.interpret) or not torch.cuda.is_available()


def jit(fn):
    """`triton.jit`, built for the interpreter when INTERPRET (shared by state_scatter.py)."""
    if not INTERPRET:
        return triton.jit(fn)
    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = True
        return triton.jit(fn)


@jit
def _sum(x, axis: tl.constexpr):
    """tl.sum without its standard-library wrapper, which works in the interpreter only when
    TRITON_INTERPRET was set before triton itself was imported; tl.reduce is a builtin."""
    return tl.reduce(x, axis, tl.standard._sum_combine)


def check_slots(slots: torch.Tensor, batch: int, pool_size: int) -> None:
    assert slots.dim() == 1 and slots.shape[0] == batch, f"slots {tuple(slots.shape)} for batch {batch}"
    assert not slots.is_floating_point(), "slots must be integer"
    assert pool_size > 0
