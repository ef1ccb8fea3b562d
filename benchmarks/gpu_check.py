"""The GPU check: what the built-in engine and the harness do on one CUDA GPU, as figures (no assertions).

1. kernels: each Triton kernel, compiled for the GPU, against its torch reference through the engine's dispatch
   (decode, DFlash verify + commit, prefill extend), in fp32 and in the bf16 engine's layout, at the engine's
   "small" shape and a Qwen3-Next-like one: the largest |Triton - torch| of every output and state;
2. throughput: the trained default model's decode tokens/s on the GPU with DFLASH (B = 8) and with NONE, at
   concurrency 1 and 16, and DFLASH's acceptance length (tokens per verify step);
3. gates: `python -m harness.run --device cuda --intervals 128 --concurrency 4` with 2 replicas per pool sharing
   the one GPU (--gpus-per-rank 0.125), clean (expected PASS) and with --inject-fault stale-seq-lens (expected
   FAIL), in fp32 and in bf16: each run's exit status, verdict line and wall time.

Needs CUDA torch and triton; step 3 needs Ray (`pip install ray`, or on a host without network
`bash ../shared/device/pack-ray.sh` here and `source .gpu/unpack.sh` there). About 5-8 minutes on one GPU.

    python benchmarks/gpu_check.py [--skip-gates] [--runs-dir /tmp/gpu-check] [--json out.json]
    python benchmarks/gpu_check.py --device cpu   # the same steps at tiny sizes on CPU: the kernels in Triton's
                                                  # interpreter, the gates as --dry-run (a check of the script)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project's packages, wherever the script is run from
GATES = [("fp32 clean", (), "PASS"), ("fp32 stale-seq-lens", ("--inject-fault", "stale-seq-lens"), "FAIL"),
         ("bf16 clean", ("--dtype", "bfloat16"), "PASS"),
         ("bf16 stale-seq-lens", ("--dtype", "bfloat16", "--inject-fault", "stale-seq-lens"), "FAIL")]
# 2 replicas per pool, an eighth of the GPU each: bf16's calibration controls (automatic) make 8 replicas on the one GPU
GATE_ARGS = ("--intervals", "128", "--concurrency", "4", "--replicas", "2", "--reference-replicas", "2",
             "--gpus-per-rank", "0.125", "--no-progress")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cuda: the check; cpu: the same steps at tiny sizes (kernels interpreted, gates dry-run)")
    p.add_argument("--skip-gates", action="store_true", help="steps 1 and 2 only (no Ray needed)")
    p.add_argument("--runs-dir", default="/tmp/specgate-gpu-check", help="where the gate runs' directories go")
    p.add_argument("--new", type=int, default=128, help="tokens decoded per request in step 2")
    p.add_argument("--json", default=None, help="also write every figure to this JSON file")
    return p.parse_args(argv)


def kernel_figures(device: str) -> list[dict]:
    """Step 1: per shape, dtype and path, the largest |Triton - torch| of every tensor the dispatch writes."""
    import torch
    from kernels import LinearShape, serving_shapes

    shapes = serving_shapes() if device == "cuda" else [LinearShape("tiny", 2, 4, 4, 6, 4, 2)]
    return [row for s in shapes for dtype in (torch.float32, torch.bfloat16) for row in _kernel_case(s, dtype, device)]


def _kernel_case(s, dtype, device: str) -> list[dict]:
    """One shape and dtype: the same seeded inputs through the dispatch, once to the torch references and once to the
    Triton kernels (compiled on CUDA, interpreted on CPU); each output and state compared."""
    import torch
    import torch.nn.functional as F

    import engine.kernels as dispatch

    B, T, EXT = (16, 8, 64) if device == "cuda" else (2, 3, 5)  # batch, verify block, extend length
    H, Dk, Dv, C, K = s.heads, s.head_k_dim, s.head_v_dim, s.conv_dim, s.conv_kernel
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    q, k = (F.normalize(rand(B, EXT, H, Dk), dim=-1) for _ in range(2))  # fp32 from the layer, as served
    v, g, beta = rand(B, EXT, H, Dv), -F.softplus(rand(B, EXT, H)) * 0.5, torch.sigmoid(rand(B, EXT, H))
    x, weight = rand(B, EXT, C, scale=0.5).to(dtype), rand(C, K, scale=0.3).to(dtype)
    rec, conv = rand(1, 3 * B, H, Dk, Dv, scale=0.1).to(dtype), rand(1, 3 * B, C, K - 1, scale=0.5).to(dtype)
    order = torch.randperm(3 * B, generator=gen).to(device)
    slots, track_slots = order[:B], order[B:2 * B]  # working and tracking slots, all distinct
    commit = torch.randint(0, T, (B,), generator=gen).to(device)
    track = torch.where(torch.arange(B, device=device) % 4 == 0, commit, -1)

    def forward(t: int, rp, cp, ri=None, ci=None) -> tuple:
        sl = (slice(None), slice(0, t))
        return (dispatch.gdn_pool_forward(q[sl], k[sl], v[sl], g[sl], beta[sl], rp[0], slots, Dk**-0.5,
                                          None if ri is None else ri[0]),
                dispatch.conv_pool_forward(x[sl], cp[0], slots, weight, None if ci is None else ci[0]))

    def run(triton: bool) -> dict:
        dispatch.use_triton = lambda t: triton  # on CPU too: the interpreted kernels, or the references
        rp, cp = rec.clone(), conv.clone()
        ri = torch.empty(1, B, T, H, Dk, Dv, dtype=dtype, device=device)
        ci = torch.empty(1, B, T, C, K - 1, dtype=dtype, device=device)
        out = dict(zip(("verify: gdn out", "verify: conv out"), forward(T, rp, cp, ri, ci), strict=True))
        dispatch.commit_verified_states(rp, cp, ri, ci, slots, commit, track_slots, track)
        out.update({"verify: gdn states": ri, "verify: conv windows": ci, "commit: states": rp, "commit: windows": cp})
        for name, t in (("decode", 1), ("extend", EXT)):
            rp, cp = rec.clone(), conv.clone()
            out[f"{name}: gdn out"], out[f"{name}: conv out"] = forward(t, rp, cp)
            out[f"{name}: states"], out[f"{name}: windows"] = rp, cp
        return out

    use_triton = dispatch.use_triton
    try:
        reference, compiled = run(False), run(True)
    finally:
        dispatch.use_triton = use_triton
    return [{"shape": s.name, "dtype": str(dtype).removeprefix("torch."), "tensor": name,
             "max_abs_diff": (compiled[name].float() - ref.float()).abs().max().item()}
            for name, ref in reference.items()]


def throughput_figures(device: str, new: int) -> list[dict]:
    """Step 2: decode tokens/s with DFLASH and NONE at concurrency 1 and 16, and DFLASH's acceptance length."""
    from spec_speedup import commit_hist, decode_rate, heldout_prompts

    from engine.config import EngineConfig
    from engine.engine import Engine

    rows = []
    model = "default" if device == "cuda" else "random"
    for concurrency in (1, 16):
        prompts = heldout_prompts(concurrency, 256)
        for spec in ("NONE", "DFLASH"):
            cfg = EngineConfig(model_path=model, model_preset="tiny", device=device, speculative_algorithm=spec,
                               speculative_num_draft_tokens=8, disable_radix_cache=True,
                               max_running_requests=concurrency)
            rate, outs = decode_rate(Engine(cfg), prompts, new, f"{spec}{concurrency}-", 2 if device == "cuda" else 1)
            accept = commit_hist(outs, 8)[0] if spec == "DFLASH" else None
            rows.append({"speculative_algorithm": spec, "concurrency": concurrency, "decode_tokens_per_s": rate,
                         "accept_length": accept})
    return rows


def gate_figures(device: str, runs_dir: str) -> list[dict]:
    """Step 3: the four harness runs (on CPU: their --dry-run, which checks the flags and shows the plan)."""
    rows = []
    for name, extra, expected in GATES:
        run_id = name.replace(" ", "-")
        cmd = [sys.executable, "-m", "harness.run", "--device", device, *GATE_ARGS, *extra, "--runs-dir", runs_dir,
               "--run-id", run_id]
        if device == "cpu":
            cmd = [c for c in cmd if c not in ("--gpus-per-rank", "0.125")] + ["--dry-run"]
        t0 = time.perf_counter()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # keep a packed Ray's site
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path))
        verdict = next((line for line in proc.stdout.splitlines()
                        if line.startswith(("PASS", "FAIL", "INCONCLUSIVE"))), "")
        if device == "cpu":
            verdict = next((line for line in proc.stdout.splitlines() if line.startswith("placement:")), "")
        rows.append({"run": name, "expected": expected if device == "cuda" else "dry run", "exit": proc.returncode,
                     "verdict": verdict, "seconds": time.perf_counter() - t0,
                     "error": proc.stderr.strip().splitlines()[-1] if proc.returncode not in (0, 1) and proc.stderr
                     else ""})
    return rows


def device_line(device: str) -> str:
    import torch
    import triton

    if device == "cpu":
        return f"device: cpu (a check of the script; no GPU figure), torch {torch.__version__}, triton " \
               f"{triton.__version__} interpreted"
    return (f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"triton {triton.__version__} compiled")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernels then run on CPU tensors
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (python benchmarks/gpu_check.py --device cpu checks the script)")
        return 0
    torch.set_num_threads(1 if args.device == "cpu" else torch.get_num_threads())
    figures: dict = {"device": device_line(args.device)}
    print(figures["device"])
    t0 = time.perf_counter()
    figures["kernels"] = kernel_figures(args.device)
    built = "compiled" if args.device == "cuda" else "interpreted"
    print(f"\n1. kernels: Triton ({built}) against the torch references, max |difference|")
    for r in figures["kernels"]:
        print(f"  {r['shape']:<11} {r['dtype']:<9} {r['tensor']:<22} {r['max_abs_diff']:.3g}")
    figures["throughput"] = throughput_figures(args.device, args.new if args.device == "cuda" else 8)
    model = "the trained default model" if args.device == "cuda" else "random tiny weights"
    print(f"\n2. decode throughput, {model} (DFLASH B = 8; held-out prompts of 256 bytes)")
    for r in figures["throughput"]:
        accept = f", accept length {r['accept_length']:.2f}" if r["accept_length"] is not None else ""
        print(f"  {r['speculative_algorithm']:<6} concurrency {r['concurrency']:>2}: "
              f"{r['decode_tokens_per_s']:.0f} tokens/s{accept}")
    if not args.skip_gates:
        figures["gates"] = gate_figures(args.device, args.runs_dir)
        shown = GATE_ARGS if args.device == "cuda" else (*GATE_ARGS[:8], *GATE_ARGS[10:], "--dry-run")
        print(f"\n3. harness.run --device {args.device} {' '.join(shown)}")
        for r in figures["gates"]:
            print(f"  {r['run']:<20} expected {r['expected']:<8} exit {r['exit']} in {r['seconds']:.0f}s: "
                  f"{r['verdict'] or r['error']}")
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
