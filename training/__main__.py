"""Train the built-in engine's default model: the `small` hybrid target, then its DFlash drafter.

    python -m training                      # ~17 + 10 minutes on 2 CPU cores
    python -m training --resume             # continue from ckpt/train/ after an interruption
    python -m training --target-steps 600 --drafter-steps 1500   # step counts instead of time budgets

Phase 1 trains the target on next-byte prediction over Python standard-library
source (held-out files excluded, see training/data.py). Phase 2 distils the
drafter from the frozen target's greedy continuations (training/drafter.py).
Writes `config.json`, `model.safetensors` and `drafter.safetensors` (bfloat16),
the byte tokenizer's `tokenizer.json` and `tokenizer_config.json`, plus
`training.json` (what was run and measured) to --out. See docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from engine.model.config import preset
from engine.model.hybrid import HybridLM
from engine.model.weights import load_full_state_dict, save_weights
from engine.runner import DEFAULT_WEIGHTS
from protocol import byte_export
from training.data import load_corpus
from training.drafter import (
    DrafterTrainConfig,
    DrafterTrainer,
    Rollouts,
    generate_rollouts,
    loop_budget,
    teacher_force,
)
from training.loop import load_ckpt, save_ckpt
from training.target import TargetTrainConfig, TargetTrainer, bf16_rounded

CKPT_DIR = Path("ckpt") / "train"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    t, d = TargetTrainConfig(), DrafterTrainConfig()
    ap = argparse.ArgumentParser(prog="python -m training", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS, help="weights directory to write")
    ap.add_argument("--ckpt", type=Path, default=CKPT_DIR, help="checkpoint directory (gitignored)")
    ap.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --ckpt")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: on a shared 2-core machine a second thread stalls on the other "
                         "jobs; 2 is ~1.3x faster on an idle one)")
    ap.add_argument("--target-minutes", type=float, default=t.minutes, help="target training-loop budget")
    ap.add_argument("--target-steps", type=int, default=0, help="fixed target steps instead of a time budget")
    ap.add_argument("--seq-len", type=int, default=t.seq_len)
    ap.add_argument("--batch-size", type=int, default=t.batch_size)
    ap.add_argument("--lr", type=float, default=t.lr)
    ap.add_argument("--drafter-minutes", type=float, default=d.minutes,
                    help="drafter phase budget, rollouts and teacher forcing included")
    ap.add_argument("--drafter-steps", type=int, default=0, help="fixed drafter steps instead of a time budget")
    ap.add_argument("--drafter-layers", type=int, default=preset("small").drafter_num_layers)
    ap.add_argument("--rollouts", type=int, default=d.rollouts, help="greedy target continuations to distil")
    ap.add_argument("--block-size", type=int, default=d.block_size, help="DFlash block size B in training")
    ap.add_argument("--drafter-lr", type=float, default=d.lr)
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    """Both phases, resumable; returns the training report (also written to --out/training.json)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.monotonic()
    cfg = replace(preset("small"), drafter_num_layers=args.drafter_layers)
    tc = TargetTrainConfig(minutes=args.target_minutes, steps=args.target_steps, seq_len=args.seq_len,
                           batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    dc = DrafterTrainConfig(minutes=args.drafter_minutes, steps=args.drafter_steps, rollouts=args.rollouts,
                            block_size=args.block_size, lr=args.drafter_lr, seed=args.seed)
    target_ck, drafter_ck = args.ckpt / "target.pt", args.ckpt / "drafter.pt"
    if not args.resume:
        for p in (target_ck, drafter_ck):
            p.unlink(missing_ok=True)
    corpus = load_corpus()
    print(f"corpus: {corpus.train_files} train files ({len(corpus.train)} bytes), {corpus.validation_files} "
          f"validation files ({len(corpus.validation)} bytes); excluded: {corpus.heldout_files} held-out files, "
          f"{corpus.generated_files} generated codec tables")
    report: dict = {"config": {"target": asdict(tc), "drafter": asdict(dc), "threads": args.threads}}

    # --- phase 1: target ---------------------------------------------------------
    tt = TargetTrainer(cfg, tc, corpus)
    st = load_ckpt(target_ck)
    if st is not None:
        tt.load_state_dict(st["trainer"])
        print(f"resumed target at step {tt.step} ({tt.elapsed:.0f}s trained)")
    if st is None or not st.get("done"):
        def ckpt_target(t):
            save_ckpt(target_ck, {"trainer": t.state_dict(), "done": False})

        tt.train(ckpt_target)
        save_ckpt(target_ck, {"trainer": tt.state_dict(), "done": True})
    served = bf16_rounded(tt.model.state_dict())
    target = HybridLM(cfg).eval()
    load_full_state_dict(target, served)  # the drafter learns the target exactly as it will be served
    val_bpb = round(tt.validation_bpb(), 4)
    report["target"] = {"steps": tt.step, "train_seconds": round(tt.elapsed, 1),
                        "tokens": tt.step * tc.batch_size * tc.seq_len, "validation_bpb": val_bpb,
                        "loss_history": tt.history[:: max(1, len(tt.history) // 40)]}
    print(f"target: {tt.step} steps, {report['target']['tokens']} tokens, validation {val_bpb} bits/byte")

    # --- phase 2: drafter ---------------------------------------------------------
    phase_start = time.monotonic()
    st = load_ckpt(drafter_ck)
    if st is not None:
        ro = Rollouts(st["rollouts_ids"], st["rollouts_prompt_lens"])
        print(f"resumed rollouts ({len(ro.ids)})")
    else:
        ro = generate_rollouts(cfg, served, corpus.train.numpy().tobytes(), dc)
    agree = teacher_force(target, ro)
    print(f"rollouts: {len(ro.ids)} x {ro.ids.shape[1]} tokens; teacher-forced argmax agrees with "
          f"{agree:.4f} of generated tokens")
    dt = DrafterTrainer(cfg, dc, target, ro)
    rollout_state = {"rollouts_ids": ro.ids, "rollouts_prompt_lens": ro.prompt_lens}
    if st is not None and st.get("trainer"):
        dt.load_state_dict(st["trainer"])
        print(f"resumed drafter at step {dt.step}")
    else:
        dt.budget_s = loop_budget(dc, time.monotonic() - phase_start)
    save_ckpt(drafter_ck, {**rollout_state, "trainer": dt.state_dict(), "done": False})
    if st is None or not st.get("done"):
        def ckpt_drafter(t):
            save_ckpt(drafter_ck, {**rollout_state, "trainer": t.state_dict(), "done": False})

        dt.train(ckpt_drafter)
        save_ckpt(drafter_ck, {**rollout_state, "trainer": dt.state_dict(), "done": True})
    accept = dt.evaluate()
    report["drafter"] = {"layers": cfg.drafter_num_layers, "steps": dt.step, "train_seconds": round(dt.elapsed, 1),
                         "rollouts": len(ro.ids), "teacher_forced_agreement": round(agree, 4),
                         "simulated_accept": accept,
                         "loss_history": dt.history[:: max(1, len(dt.history) // 40)]}
    print("drafter: " + ", ".join(f"{k} mean commit length {v['mean_commit_len']}" for k, v in accept.items()))

    # --- output ----------------------------------------------------------------
    save_weights(args.out, cfg, served, "model")
    save_weights(args.out, cfg, bf16_rounded(dt.drafter.state_dict()), "drafter")
    byte_export.write(Path(args.out))  # tokenizer files: tools load the tokenizer from the model directory
    report["wall_seconds_this_run"] = round(time.monotonic() - started, 1)
    (Path(args.out) / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} in {report['wall_seconds_this_run']:.0f}s")
    return report


def main(argv: list[str] | None = None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
