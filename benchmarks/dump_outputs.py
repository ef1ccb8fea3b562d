"""Dump the built-in engine's outputs (ids and log-probs) for a fixed two-turn workload, to compare trees bit for bit.

Used to show that a change leaves the fp32 engine's outputs identical: run it once with
the engine imported from the old tree and once from the new one, then compare the two
files exactly (`--compare A B`):

    PYTHONPATH=/tmp/base python benchmarks/dump_outputs.py --out /tmp/base.json
    python benchmarks/dump_outputs.py --out /tmp/new.json
    python benchmarks/dump_outputs.py --compare /tmp/base.json /tmp/new.json

The workload: sessions of held-out text whose prompts end around multiples of the track
interval, each run as turn 1 and then turn 2 = turn 1 + its output + a suffix (so turn 2
restores a checkpoint), for NONE and DFLASH, at every `--concurrency` (that many requests
in the running batch at once). Every output's token ids, chosen-token log-probs and top-2
log-probs are written as JSON (floats as their exact `float.hex`), with `engine.__file__`
so that the file says which tree produced it. `--dtype` is passed only when it is not the
default (an older tree has no such setting).
"""

from __future__ import annotations

import argparse
import json
import sys

PROMPT_OFFSETS = (-9, -3, -1, 0, 1, 5)  # prompt lengths relative to a multiple of the interval
SUFFIX = tuple(b"\n# next question:")


def prompts(interval: int) -> list[tuple[int, ...]]:
    """Turn-1 prompts: held-out text cut to lengths around the first two multiples of the interval."""
    from workloads.corpus import TextCursor, heldout_documents

    cursor = TextCursor(heldout_documents())
    lengths = [m * interval + off for m in (1, 2) for off in PROMPT_OFFSETS]
    return [tuple(cursor.take(n).encode("ascii")) for n in lengths]


def run(algorithm: str, concurrency: int, args) -> list[dict]:
    """Both turns of every session on one engine; one entry per output, in request order."""
    import torch

    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.io_struct import GenerateRequest, SamplingParams

    torch.set_num_threads(1)
    extra = {"dtype": args.dtype} if args.dtype != "float32" else {}
    # state slots for every session's checkpoints: turn 2 restores even at concurrency 1
    cfg = EngineConfig(model_path=args.model_path, speculative_algorithm=algorithm,
                       mamba_track_interval=args.interval, max_running_requests=concurrency, max_state_slots=128,
                       **extra)
    engine = Engine(cfg)

    def req(rid, ids, n):
        return GenerateRequest(rid, tuple(ids), SamplingParams(max_new_tokens=n, ignore_eos=True),
                               return_logprob=True, top_logprobs_num=2)

    firsts = prompts(args.interval)
    turn1 = engine.generate([req(f"s{i}-1", ids, args.max_new) for i, ids in enumerate(firsts)])
    seconds = [tuple(ids) + tuple(o.output_ids) + SUFFIX for ids, o in zip(firsts, turn1, strict=True)]
    turn2 = engine.generate([req(f"s{i}-2", ids, args.max_new) for i, ids in enumerate(seconds)])
    return [{"rid": o.rid, "output_ids": o.output_ids, "cached_tokens": o.cached_tokens,
             "logprobs": [float(x).hex() for x in o.output_logprobs],
             "top": [[[float(lp).hex(), t] for lp, t in top] for top in o.output_top_logprobs]}
            for o in turn1 + turn2]


def dump(args) -> None:
    import engine

    out = {"engine": engine.__file__, "dtype": args.dtype, "interval": args.interval, "runs": {}}
    for algorithm in args.algorithms:
        for c in args.concurrency:
            out["runs"][f"{algorithm}/c{c}"] = run(algorithm, c, args)
            print(f"{algorithm} c={c}: {len(out['runs'][f'{algorithm}/c{c}'])} outputs", flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f)
    print(f"wrote {args.out} (engine from {engine.__file__})")


def compare(path_a: str, path_b: str) -> int:
    """Print every difference between two dumps; 0 when identical, 1 otherwise."""
    a, b = (json.load(open(p)) for p in (path_a, path_b))
    print(f"A: {a['engine']}\nB: {b['engine']}")
    diffs, n = [], 0
    for key in sorted(a["runs"].keys() | b["runs"].keys()):
        ra, rb = a["runs"].get(key), b["runs"].get(key)
        if ra is None or rb is None:
            diffs.append(f"{key}: only in {'B' if ra is None else 'A'}")
            continue
        for oa, ob in zip(ra, rb, strict=True):
            n += 1
            for field in ("output_ids", "cached_tokens", "logprobs", "top"):
                if oa[field] != ob[field]:
                    diffs.append(f"{key} {oa['rid']}: {field} differ")
    for line in diffs:
        print(line)
    worst = max((abs(float.fromhex(x) - float.fromhex(y))
                 for key in a["runs"].keys() & b["runs"].keys()
                 for oa, ob in zip(a["runs"][key], b["runs"][key], strict=True)
                 for x, y in zip(oa["logprobs"], ob["logprobs"], strict=False)), default=0.0)
    print(f"{n} outputs compared: " + ("identical" if not diffs else f"{len(diffs)} differences")
          + f"; max |d logprob| {worst:g}")
    return 1 if diffs else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the dump here")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two dumps exactly")
    ap.add_argument("--model-path", default="default")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--interval", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--algorithms", nargs="+", default=["NONE", "DFLASH"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 5, 16])
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if not args.out:
        ap.error("--out FILE (or --compare A B) is required")
    dump(args)


if __name__ == "__main__":
    main()
