"""Compile every Triton kernel for a Hopper GPU (sm_90) without one: ttir -> ttgir -> llir -> ptx -> cubin.

The interpreter checks the math, not that the kernels lower to real hardware; this
does. Run as `python -m tests.engine.kernels.aot_compile` WITHOUT TRITON_INTERPRET (the test
runs it in a subprocess): it pretends CUDA is present so the modules build real
`triton.jit` kernels, then compiles each in both modes at Qwen3-Next-like shapes.
"""

from __future__ import annotations

import sys

import torch


def _signature(fn, pointers: dict[str, str], floats: tuple[str, ...], constexprs: dict) -> dict[str, str]:
    """Argument types: pointers as given, named floats fp32, constexprs, every other scalar i64."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in pointers:
            sig[name] = pointers[name]
        else:
            sig[name] = "fp32" if name in floats else "i64"
    return sig


def main() -> int:
    torch.cuda.is_available = lambda: True  # build triton.jit kernels, not interpreted ones
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from engine.kernels import conv_triton, gdn_triton, triton_jit
    from engine.kernels.state_scatter_triton import _state_scatter_kernel

    assert not triton_jit.INTERPRET, "run without TRITON_INTERPRET"
    target = GPUTarget("cuda", 90, 32)
    act, st = "*bf16", "*fp32"
    cases = []
    gdn_ptrs = dict(q=act, k=act, v=act, g=act, beta=act, o=act, pool=st, slots="*i64", inter=st,
                    track_slots="*i64", track_steps="*i64")
    gdn_dims = dict(H=32, HQ=16, DK=128, DV=128, BK=128, BV=8)
    # extend with a prefill checkpoint, into a bf16 state pool (--mamba-ssm-dtype bfloat16)
    cases.append((gdn_triton._gdn_recurrent_kernel, dict(gdn_ptrs, pool="*bf16"), ("scale",),
                  dict(gdn_dims, VERIFY=False, TRACK=True), 1))
    for verify in (False, True):
        cases.append((gdn_triton._gdn_recurrent_kernel, gdn_ptrs,
                      ("scale",), dict(gdn_dims, VERIFY=verify, TRACK=False), 1))
        cases.append((conv_triton._conv_window_kernel,
                      dict(x=act, y=act, pool=st, slots="*i64", weight=act, inter=st),
                      (), dict(KW=3, BF=4, BW=4, BC=256, VERIFY=verify), 4))
    scatter_idx = dict(working_slots="*i64", commit_steps="*i64", track_slots="*i64", track_steps="*i32")
    cases.append((_state_scatter_kernel, dict(rec_pool=st, rec_inter=st, conv_pool=st, conv_inter=st, **scatter_idx),
                  (), dict(BLOCK=1024), 4))
    # the bf16 engine's calls (--dtype bfloat16): fp32 q/k/v/g/beta from the layer, bf16 pools and intermediates
    f32, bf = "*fp32", "*bf16"
    bf16_gdn = dict(gdn_ptrs, q=f32, k=f32, v=f32, g=f32, beta=f32, o=f32, pool=bf, inter=bf)
    for verify in (False, True):
        cases.append((gdn_triton._gdn_recurrent_kernel, bf16_gdn, ("scale",),
                      dict(gdn_dims, VERIFY=verify, TRACK=not verify), 1))
        cases.append((conv_triton._conv_window_kernel, dict(x=bf, y=bf, pool=bf, slots="*i64", weight=bf, inter=bf),
                      (), dict(KW=3, BF=4, BW=4, BC=256, VERIFY=verify), 4))
    cases.append((_state_scatter_kernel, dict(rec_pool=bf, rec_inter=bf, conv_pool=bf, conv_inter=bf, **scatter_idx),
                  (), dict(BLOCK=1024), 4))
    for fn, pointers, floats, constexprs, num_warps in cases:
        src = ASTSource(fn, _signature(fn, pointers, floats, constexprs), constexprs=constexprs)
        compiled = triton.compile(src, target=target, options={"num_warps": num_warps})
        assert compiled.asm.get("cubin"), fn.__name__
        mode = f"{constexprs.get('VERIFY', '')} {constexprs.get('TRACK', '')}"
        print(f"{fn.__name__} {mode}: cubin {len(compiled.asm['cubin'])} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
