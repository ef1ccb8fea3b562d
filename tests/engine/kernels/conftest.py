"""Kernel tests run compiled on a CUDA device, and in Triton's interpreter on CPU tensors where there is none.

Triton reads TRITON_INTERPRET when a kernel is decorated (and its standard library
when triton is imported), so without CUDA it is set at import time, before any test
module here imports triton or the kernels. The kernel modules also build themselves
for the interpreter on machines without CUDA, in case another test imported triton
first. With CUDA nothing is set: the kernels compile, and the tests put their inputs
on the GPU (tests/engine/kernels/device.py).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import engine.kernels.state_scatter_triton  # noqa: E402, F401  (the Triton module; the dispatch is commit_verified_states)
