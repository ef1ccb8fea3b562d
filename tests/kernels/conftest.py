"""Kernel tests run Triton in its interpreter on CPU tensors.

Triton reads TRITON_INTERPRET when a kernel is decorated (and its standard library
when triton is imported), so this is set at import time, before any test module
here imports triton or the kernels. The kernel modules also build themselves for
the interpreter on machines without CUDA, in case another test imported triton first.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import engine.kernels as _kernels  # noqa: E402

# Importing the submodule engine.kernels.state_scatter makes Python set the package
# attribute `state_scatter` to that module, shadowing the dispatch *function* of the
# same name that engine code calls as `kernels.state_scatter(...)`. Load it once here
# and put the function back, so these tests leave the package as production sees it.
_dispatch_state_scatter = _kernels.state_scatter
import engine.kernels.state_scatter  # noqa: E402, F401

_kernels.state_scatter = _dispatch_state_scatter
