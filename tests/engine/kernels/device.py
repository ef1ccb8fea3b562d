"""Where the kernel tests put their tensors: the GPU where there is one (the kernels compiled), else the CPU (the
kernels interpreted, conftest.py)."""

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def on_device(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors on DEVICE (the same objects on CPU)."""
    return [t.to(DEVICE) for t in tensors]
