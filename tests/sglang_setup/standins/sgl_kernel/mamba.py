"""The stand-in's `sgl_kernel.mamba` (see sgl_kernel/__init__.py): SGLang's CPU linear-attention backends import
their conv and gated-delta-rule kernels from here (`from sgl_kernel.mamba import causal_conv1d_fn_cpu, ...` in
sglang/srt/layers/attention/linear/gdn_backend.py, kda_backend.py, kernels/gdn_triton.py). Only `*_cpu` names
exist, and they raise NotImplementedError when called: a hybrid model stops at its first forward, with a
message that names the missing kernel."""

from sgl_kernel import _op


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _op(name)
