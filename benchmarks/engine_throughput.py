"""Engine throughput on this machine: prefill tokens/s, decode tokens/s at concurrency 1 and 16, spec vs not.

Prints figures (no assertions). Usage: python benchmarks/engine_throughput.py [--preset small] [--new 64]
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.io_struct import GenerateRequest, SamplingParams


def _reqs(n: int, plen: int, new: int, tag: str) -> list[GenerateRequest]:
    rng = random.Random(0)
    return [GenerateRequest(f"{tag}{i}", tuple(rng.randrange(256) for _ in range(plen)),
                            SamplingParams(max_new_tokens=new, ignore_eos=True)) for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-path", default="random")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (local processes, gloo)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = dict(model_path=args.model_path, model_preset=args.preset, disable_radix_cache=True)
    e = Engine(EngineConfig(**base))
    n_params = sum(p.numel() for p in e.runner.model.parameters())
    print(f"model {args.preset}: {n_params:,} parameters, torch threads {args.threads}")
    ids = _reqs(1, 1024, 1, "p")[0].input_ids
    t = time.perf_counter()
    for _ in range(3):
        e.runner.extend(list(ids[:512]), 0, list(range(40)), 0)
    print(f"forward (prefill chunk 512): {3 * 512 / (time.perf_counter() - t):,.0f} tokens/s")
    for spec in ("NONE", "DFLASH"):
        cfg = EngineConfig(speculative_algorithm=spec, tp_size=args.tp, **base)
        if args.tp > 1:
            from engine.tp.local import start_local

            e, _, _ = start_local(cfg)
        else:
            e = Engine(cfg)
        for conc in (1, 16):
            reqs = _reqs(conc, args.prompt, args.new, f"{spec}{conc}-")
            t = time.perf_counter()
            outs = e.generate(reqs)
            dt = time.perf_counter() - t
            toks = sum(len(o.output_ids) for o in outs)
            acc = sum(o.spec_accept_length for o in outs) / len(outs) if spec == "DFLASH" else float("nan")
            print(f"{spec:6s} tp {args.tp} concurrency {conc:2d}: {toks / dt:8.1f} output tokens/s "
                  f"(prompt {args.prompt}, {args.new} new each; accept length {acc:.2f})")
        if args.tp > 1:
            e.runner.shutdown()


if __name__ == "__main__":
    main()
