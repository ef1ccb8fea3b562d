"""Engine throughput on this machine: prefill tokens/s, decode tokens/s at concurrency 1 and 16, spec vs not.

Also the achieved FLOP/s of the non-speculative decode (concurrency 1 and 16) and of the prefill as a
fraction of a matmul roofline measured in the same run: torch matmuls of the model's own linear shapes
at a large batch (--roofline-batch rows), on the same torch threads. The model's FLOPs per token are
counted analytically (module doc of `model_flops`).

Every rate is measured on the wall clock and on this process's CPU clock (the cpu figure, in
brackets and in the roofline fractions, is the steadier one on a shared machine: torch runs one
thread here, so CPU seconds are the seconds the work had a core).

`--dtype bfloat16` runs the engine (and the roofline's matmuls) in bf16: run it beside the fp32
default to see what bf16 costs on this CPU (one without native bf16 matmuls emulates them).

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
from engine.model.layers import ColumnParallelLinear, RowParallelLinear, linear


def _reqs(n: int, plen: int, new: int, tag: str) -> list[GenerateRequest]:
    rng = random.Random(0)
    return [GenerateRequest(f"{tag}{i}", tuple(rng.randrange(256) for _ in range(plen)),
                            SamplingParams(max_new_tokens=new, ignore_eos=True)) for i in range(n)]


def linear_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(in, out) of every matmul weight of the target per token: its linears and the tied LM head."""
    shapes = [(m.weight.shape[1], m.weight.shape[0]) for m in model.modules()
              if isinstance(m, (ColumnParallelLinear, RowParallelLinear, torch.nn.Linear))]
    return shapes + [(model.embed.weight.shape[1], model.embed.weight.shape[0])]


def model_flops(model: torch.nn.Module, context: float) -> float:
    """FLOPs per token at a mean `context` length: 2 x matmul weights, attention 4 x context x heads x
    head_dim per attention layer, the delta rule ~8 x heads x Dk x Dv per GDN layer (decay, S^T k, k u^T,
    the update, S^T q)."""
    cfg = model.cfg
    flops = sum(2 * i * o for i, o in linear_shapes(model))
    flops += len(cfg.attention_layers) * 4 * context * cfg.num_attention_heads * cfg.head_dim
    flops += len(cfg.linear_layers) * 8 * cfg.linear_num_value_heads * cfg.linear_key_head_dim * \
        cfg.linear_value_head_dim
    return flops


def now() -> tuple[float, float]:
    """(wall, process CPU) seconds."""
    return time.perf_counter(), time.process_time()


def since(t0: tuple[float, float]) -> tuple[float, float]:
    """Elapsed (wall, CPU) seconds since t0."""
    t1 = now()
    return t1[0] - t0[0], t1[1] - t0[1]


def roofline(model: torch.nn.Module, rows: int, repeats: int = 3, dtype: torch.dtype = torch.float32) -> float:
    """CPU-clock FLOP/s of the engine's `linear` over the model's weight shapes at `rows` tokens per matmul, best of
    repeats."""
    weights = [(torch.randn(rows, i, dtype=dtype), torch.randn(o, i, dtype=dtype)) for i, o in linear_shapes(model)]
    flops = sum(2 * rows * w.shape[0] * w.shape[1] for _, w in weights)
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        for x, w in weights:
            linear(x, w)  # the engine's linear: in bf16 on a CPU, fp32 products of the bf16 values
        best = min(best, time.process_time() - t)
    return flops / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-path", default="random")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (local processes, gloo)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the engine's --dtype")
    ap.add_argument("--roofline-batch", type=int, default=2048, help="rows of the roofline matmuls")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = dict(model_path=args.model_path, model_preset=args.preset, disable_radix_cache=True, dtype=args.dtype)
    e = Engine(EngineConfig(**base))
    n_params = sum(p.numel() for p in e.runner.model.parameters())
    print(f"model {args.preset}: {n_params:,} parameters, dtype {args.dtype}, torch threads {args.threads}")
    ids = _reqs(1, 1024, 1, "p")[0].input_ids
    model = e.runner.model
    peak = roofline(model, args.roofline_batch, dtype=e.runner.dtype)
    print(f"matmul roofline (the model's {len(linear_shapes(model))} weight shapes x {args.roofline_batch} rows): "
          f"{peak / 1e9:.2f} GFLOP/s")
    t = now()
    for _ in range(3):
        e.runner.extend(list(ids[:512]), 0, list(range(40)), 0)
    wall, cpu = since(t)
    achieved = 3 * 512 / cpu * model_flops(model, 256)
    print(f"forward (prefill chunk 512): {3 * 512 / wall:,.0f} tokens/s [{3 * 512 / cpu:,.0f} per CPU-second], "
          f"{achieved / 1e9:.2f} GFLOP/s = {100 * achieved / peak:.1f}% of the roofline")
    for spec in ("NONE", "DFLASH"):
        cfg = EngineConfig(speculative_algorithm=spec, tp_size=args.tp, **base)
        if args.tp > 1:
            from engine.tp.local import start_local

            e, _, _ = start_local(cfg)
        else:
            e = Engine(cfg)
        for conc in (1, 16):
            reqs = _reqs(conc, args.prompt, args.new, f"{spec}{conc}-")
            t = now()
            outs = e.generate(reqs)
            wall, cpu = since(t)
            toks = sum(len(o.output_ids) for o in outs)
            acc = sum(o.spec_accept_length for o in outs) / len(outs) if spec == "DFLASH" else float("nan")
            line = (f"{spec:6s} tp {args.tp} concurrency {conc:2d}: {toks / wall:8.1f} output tokens/s "
                    f"[{toks / cpu:.1f} per CPU-second] (prompt {args.prompt}, {args.new} new each; "
                    f"accept length {acc:.2f})")
            if spec == "NONE" and args.tp == 1:  # decode alone: minus the same prompts' prefill-only time
                t = now()
                e.generate(_reqs(conc, args.prompt, 1, f"{spec}{conc}p-"))
                p_wall, p_cpu = since(t)
                decode, decode_cpu = (toks - conc) / max(1e-9, wall - p_wall), (toks - conc) / max(1e-9, cpu - p_cpu)
                achieved = decode_cpu * model_flops(model, args.prompt + args.new / 2)
                line += (f"\n       decode only {decode:8.1f} tokens/s [{decode_cpu:.1f} per CPU-second], "
                         f"{achieved / 1e9:.3f} GFLOP/s = {100 * achieved / peak:.1f}% of the roofline")
            print(line)
        if args.tp > 1:
            e.runner.shutdown()


if __name__ == "__main__":
    main()
