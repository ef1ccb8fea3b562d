"""sgl_kernel.mamba: the conv and gated-delta-rule CPU ops (real ones in cpu_ops.py)."""
from sgl_kernel import _op


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _op(name)
