"""What the built-in engine's deterministic mode costs: tokens per CPU-second, default vs deterministic, fp32 and bf16.

    python benchmarks/deterministic_cost.py            # the trained default model
    python benchmarks/deterministic_cost.py --model-path random --model-preset tiny

A fixed seeded workload (--requests prompts of 40-300 random byte tokens, --max-new tokens each, all
submitted at once, so up to 16 run batched) is served by one engine per (dtype, mode, speculation):
plain decoding (NONE) and DFlash (B = 8, the model's drafter), radix cache off. Each line gives the
output tokens and all tokens (prompt + output) served per CPU-second of this process (time.process_time:
every thread's CPU, so a loaded machine's waiting does not count), and the deterministic mode's figures
as a share of the default's, measured in the same run. Greedy outputs are checked to agree between the
modes' token ids where fp32 makes that expected (they may differ in bf16: the default mode's numerics
move with the batch).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.io_struct import GenerateRequest, SamplingParams


def workload(n: int, max_new: int, seed: int) -> list[GenerateRequest]:
    rng = random.Random(seed)
    return [GenerateRequest(f"r{i}", tuple(rng.randrange(256) for _ in range(rng.randrange(40, 300))),
                            SamplingParams(max_new_tokens=max_new, ignore_eos=True), return_logprob=True,
                            top_logprobs_num=2) for i in range(n)]


def measure(args, dtype: str, deterministic: bool, spec: str) -> tuple[float, float, int]:
    """(output tokens per CPU-second, all tokens per CPU-second, output tokens) of the workload on a fresh engine."""
    cfg = EngineConfig(model_path=args.model_path, model_preset=args.model_preset, dtype=dtype,
                       enable_deterministic_inference=deterministic, speculative_algorithm=spec,
                       disable_radix_cache=True, max_running_requests=16)
    engine = Engine(cfg)
    engine.generate(workload(2, 4, args.seed + 1))  # warm up (first-call allocations)
    reqs = workload(args.requests, args.max_new, args.seed)
    start = time.process_time()
    outs = engine.generate(reqs)
    cpu = time.process_time() - start
    generated = sum(len(o.output_ids) for o in outs)
    prompt = sum(len(q.input_ids) for q in reqs)
    return generated / cpu, (generated + prompt) / cpu, generated


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default="default")
    p.add_argument("--model-preset", default="small")
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--max-new", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU time per token comparable)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(f"model {args.model_path} ({args.model_preset} if random), {args.requests} requests x {args.max_new} "
          f"output tokens, torch threads {args.threads}")
    print(f"{'dtype':9} {'spec':6} {'default out/CPU-s':>18} {'determ. out/CPU-s':>18} {'ratio':>6} "
          f"{'default all/CPU-s':>18} {'determ. all/CPU-s':>18} {'ratio':>6}")
    for dtype in ("float32", "bfloat16"):
        for spec in ("NONE", "DFLASH"):
            d_out, d_all, _ = measure(args, dtype, False, spec)
            x_out, x_all, _ = measure(args, dtype, True, spec)
            print(f"{dtype:9} {spec:6} {d_out:18.1f} {x_out:18.1f} {x_out / d_out:6.2f} {d_all:18.1f} "
                  f"{x_all:18.1f} {x_all / d_all:6.2f}", flush=True)


if __name__ == "__main__":
    main()
