"""DFlash speedup of the trained default model on held-out prompts, and what the model looks like.

Prints (no assertions):
  * decode tokens/s with and without DFlash (B = 8 and 16) at concurrency 1 and 8, best of --repeats runs;
  * the acceptance-length distribution (commit length per verify step, from spec_trace) at B = 8 and B = 16;
  * held-out bits per byte and the share of positions whose top-1/top-2 log-prob margin is below 0.5;
  * the acceptance histogram over the frozen suite's turn-0 prompts (their max_new_tokens and interval).

With --http, instead: decode tokens/s at concurrency 1 through `python -m engine.serve` servers
started side by side (no speculation, and DFlash at each --http-blocks size, default 8 and 16; radix
cache off so repeats do not hit it), the same prompts sent one at a time to each in turn, and each
DFlash server's ratio to the plain one, best of --repeats.

Usage: python benchmarks/spec_speedup.py [--model-path default] [--new 128] [--threads 1] [--no-frozen] [--http]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.io_struct import GenerateOutput, GenerateRequest, SamplingParams
from engine.runner import resolve_model
from training.data import fixed_windows
from training.forward import target_forward
from workloads import load_suite
from workloads.corpus import TextCursor, heldout_documents, heldout_text

MARGIN_THRESHOLD = 0.5


def heldout_prompts(n: int, length: int) -> list[tuple[int, ...]]:
    """n consecutive, non-overlapping held-out slices of `length` bytes, each starting a line."""
    cursor = TextCursor(heldout_documents())
    return [tuple(cursor.take(length).encode("ascii")) for _ in range(n)]


def make_engine(model_path: str, spec: str, block: int = 8, concurrency: int = 8, interval: int = 256) -> Engine:
    return Engine(EngineConfig(model_path=model_path, speculative_algorithm=spec, speculative_num_draft_tokens=block,
                               disable_radix_cache=True, max_running_requests=concurrency,
                               mamba_track_interval=interval))


def run(engine: Engine, prompts, new: int, tag: str, top: int = 0) -> tuple[list[GenerateOutput], float]:
    reqs = [GenerateRequest(f"{tag}{i}", p, SamplingParams(max_new_tokens=new, ignore_eos=True),
                            return_logprob=top > 0, top_logprobs_num=top) for i, p in enumerate(prompts)]
    t = time.perf_counter()
    outs = engine.generate(reqs)
    return outs, time.perf_counter() - t


def decode_rate(engine: Engine, prompts, new: int, tag: str, repeats: int) -> tuple[float, list[GenerateOutput]]:
    """Decode tokens/s, best of `repeats` (the machine may be shared): (tokens - first token) / (time - the
    same prompts' prefill-only time)."""
    best, outs = 0.0, []
    for r in range(repeats):
        _, t_prefill = run(engine, prompts, 1, f"{tag}p{r}-")
        outs, t_all = run(engine, prompts, new, f"{tag}{r}-")
        toks = sum(len(o.output_ids) - 1 for o in outs)
        best = max(best, toks / max(1e-9, t_all - t_prefill))
    return best, outs


def commit_hist(outs: list[GenerateOutput], block: int) -> tuple[float, list[int]]:
    """Mean commit length (SGLang's accept length: tokens per verify step) and counts of commit length 1..B."""
    c = Counter(cl for o in outs for _, cl, _ in o.spec_trace)
    steps = sum(c.values())
    return sum(k * v for k, v in c.items()) / max(1, steps), [c.get(k, 0) for k in range(1, block + 1)]


def fmt_hist(h: list[int]) -> str:
    total = max(1, sum(h))
    return " ".join(f"{i + 1}:{100 * v / total:.0f}%" for i, v in enumerate(h))


@torch.no_grad()
def heldout_figures(model_path: str, windows: int, length: int = 512) -> tuple[float, float]:
    """(bits per byte, share of positions with top-1/top-2 margin < 0.5) over fixed held-out windows."""
    from engine.model.hybrid import HybridLM
    from engine.model.weights import load_full_state_dict

    mcfg, full, _ = resolve_model(EngineConfig(model_path=model_path))
    model = HybridLM(mcfg).eval()
    load_full_state_dict(model, full)
    text = torch.frombuffer(bytearray(heldout_text().encode("ascii")), dtype=torch.uint8)
    ids = fixed_windows(text, windows, length + 1)
    nll, low, count = 0.0, 0, 0
    for i in range(0, len(ids), 8):
        batch = ids[i : i + 8]
        h, _ = target_forward(model, batch[:, :-1])
        logp = model.logits(h).log_softmax(-1)
        nll -= logp.gather(-1, batch[:, 1:, None]).sum().item()
        top2 = logp.topk(2, dim=-1).values
        low += (top2[..., 0] - top2[..., 1] < MARGIN_THRESHOLD).sum().item()
        count += batch[:, 1:].numel()
    return nll / count / math.log(2), low / count


def frozen_histogram(model_path: str, block: int = 8) -> tuple[float, list[int], int]:
    """Turn-0 prompts of the frozen suite through the DFlash engine, per interval; (mean, histogram, steps)."""
    sessions = load_suite("frozen")
    outs = []
    for interval in sorted({s.interval for s in sessions}):
        e = make_engine(model_path, "DFLASH", block, 8, interval)
        reqs = [GenerateRequest(s.session_id, tuple(s.turns[0].input_ids),
                                SamplingParams(max_new_tokens=s.turns[0].max_new_tokens, ignore_eos=True))
                for s in sessions if s.interval == interval]
        outs += e.generate(reqs)
    mean, hist = commit_hist(outs, block)
    return mean, hist, sum(hist)


def start_server(model_path: str, spec: str, threads: int, block: int = 8) -> tuple[subprocess.Popen, str]:
    """`python -m engine.serve` on a free port (block: DFlash's draft block size); returns (process, base URL)
    once /health answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.Popen([sys.executable, "-m", "engine.serve", "--model-path", model_path, "--port", str(port),
                             "--speculative-algorithm", spec, "--disable-radix-cache",
                             *(["--speculative-num-draft-tokens", str(block)] if spec == "DFLASH" else [])], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"engine.serve --speculative-algorithm {spec} exited with status {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/health", timeout=5).read()
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"engine.serve --speculative-algorithm {spec} did not answer /health within 300s")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used so far (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_time(url: str, prompts, new: int, pid: int) -> tuple[float, float, int]:
    """(wall seconds, server CPU seconds) to send the prompts one at a time (concurrency 1), and the
    output tokens received."""
    t, c, toks = time.perf_counter(), proc_cpu(pid), 0
    for p in prompts:
        body = json.dumps({"input_ids": list(p), "sampling_params": {"max_new_tokens": new, "ignore_eos": True,
                                                                     "temperature": 0}}).encode()
        req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
        toks += len(json.loads(urllib.request.urlopen(req, timeout=600).read())["output_ids"])
    return time.perf_counter() - t, proc_cpu(pid) - c, toks


def http_speedup(args, prompts) -> None:
    """Decode tok/s through one server per configuration (NONE and DFLASH at each of --http-blocks), same
    prompts, interleaved so every server sees the same machine load; best of repeats each."""
    names = ["NONE"] + [f"DFLASH B={b}" for b in args.http_blocks]
    servers = {"NONE": start_server(args.model_path, "NONE", args.threads)}
    try:
        for b in args.http_blocks:
            servers[f"DFLASH B={b}"] = start_server(args.model_path, "DFLASH", args.threads, b)
        best = {name: 0.0 for name in names}
        best_cpu = {name: 0.0 for name in names}
        for proc, url in servers.values():
            http_time(url, prompts[:1], 16, proc.pid)  # warm-up
        for _ in range(args.repeats):
            for name, (proc, url) in servers.items():
                t_prefill, c_prefill, _ = http_time(url, prompts, 1, proc.pid)
                t_all, c_all, toks = http_time(url, prompts, args.new, proc.pid)
                best[name] = max(best[name], (toks - len(prompts)) / max(1e-9, t_all - t_prefill))
                best_cpu[name] = max(best_cpu[name], (toks - len(prompts)) / max(1e-9, c_all - c_prefill))
        for label, rates in (("wall clock", best), ("per server CPU-second (steadier on a shared machine)", best_cpu)):
            print(f"through HTTP (python -m engine.serve), concurrency 1, decode tokens/s best of {args.repeats}, "
                  f"{label}:")
            for name in names:
                print(f"  {name:<12} {rates[name]:8.1f}  speedup {rates[name] / rates['NONE']:.2f}x")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", default="default")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per configuration")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new", type=int, default=128, help="new tokens per request")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per configuration (the best is shown)")
    ap.add_argument("--bpb-windows", type=int, default=96, help="held-out windows of 512 bytes for bits per byte")
    ap.add_argument("--no-frozen", action="store_true", help="skip the frozen-suite histogram")
    ap.add_argument("--http", action="store_true", help="only the DFLASH/NONE comparison through servers")
    ap.add_argument("--http-blocks", type=lambda s: [int(b) for b in s.split(",")], default=[8, 16],
                    help="--http: DFlash block sizes, one server each (comma-separated)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    prompts = heldout_prompts(args.prompts, args.prompt_len)
    print(f"model {args.model_path!r}, {len(prompts)} held-out prompts of {args.prompt_len} bytes, "
          f"{args.new} new tokens each, greedy, torch threads {args.threads}")
    if args.http:
        http_speedup(args, prompts)
        return

    rows, rates = [], {}
    for conc in (1, 8):
        for spec, block in (("NONE", 8), ("DFLASH", 8), ("DFLASH", 16)):
            e = make_engine(args.model_path, spec, block, conc)
            run(e, prompts[:1], 16, "warm")
            rate, outs = decode_rate(e, prompts, args.new, f"{spec}{block}-{conc}-", args.repeats)
            rates[spec, block, conc] = rate
            acc = f"{commit_hist(outs, block)[0]:.2f}" if spec == "DFLASH" else "-"
            rows.append((conc, spec if spec == "NONE" else f"{spec} B={block}", rate, acc))
    print(f"\ndecode tokens/s, best of {args.repeats}")
    print(f"{'concurrency':>11}  {'algorithm':<12} {'decode tok/s':>12}  {'accept len':>10}  {'speedup':>7}")
    for conc, name, rate, acc in rows:
        print(f"{conc:>11}  {name:<12} {rate:>12.1f}  {acc:>10}  {rate / rates['NONE', 8, conc]:>6.2f}x")

    print("\nacceptance (commit length per verify step = accepted drafts + 1), held-out prompts:")
    greedy_low = None
    for block in (8, 16):
        e = make_engine(args.model_path, "DFLASH", block, 8)
        outs, _ = run(e, prompts, args.new, f"B{block}-", top=2)
        mean, hist = commit_hist(outs, block)
        print(f"  B = {block:2d}: mean {mean:.2f} over {sum(hist)} verify steps | {fmt_hist(hist)}")
        if greedy_low is None:
            margins = [t[0][0] - t[1][0] for o in outs for t in o.output_top_logprobs]
            greedy_low = sum(m < MARGIN_THRESHOLD for m in margins) / max(1, len(margins))

    bpb, low = heldout_figures(args.model_path, args.bpb_windows)
    print(f"\nheld-out: {bpb:.3f} bits per byte over {args.bpb_windows} x 512 bytes; top-1/top-2 margin < "
          f"{MARGIN_THRESHOLD}: {100 * low:.1f}% of teacher-forced positions, {100 * greedy_low:.1f}% of greedy "
          "generated positions")

    if not args.no_frozen:
        mean, hist, steps = frozen_histogram(args.model_path)
        print(f"\nfrozen suite, turn-0 prompts (B = 8, intervals 128/256 per case): mean commit length {mean:.2f} "
              f"over {steps} verify steps")
        print("  commit length: " + "  ".join(f"{i + 1}: {v}" for i, v in enumerate(hist)))


if __name__ == "__main__":
    main()
