"""Kernel tests run Triton in its interpreter on CPU tensors.

Triton reads TRITON_INTERPRET when a kernel is decorated (and its standard library
when triton is imported), so this is set at import time, before any test module
here imports triton or the kernels. The kernel modules also build themselves for
the interpreter on machines without CUDA, in case another test imported triton first.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import engine.kernels.state_scatter_triton  # noqa: E402, F401  (the Triton module; the dispatch is commit_verified_states)
