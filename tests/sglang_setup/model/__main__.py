"""`python -m tests.sglang_setup.model build`: train the tiny Qwen3-Next and its DFlash drafter; write both.

    .venv-sglang/bin/python -m tests.sglang_setup.model build                  # ~20 min on 2 shared cores
    .venv-sglang/bin/python -m tests.sglang_setup.model build --target-steps 0 --target-minutes 10  # a budget

Run from the repository root under an engine venv's interpreter (transformers). Phases: the BPE tokenizer and
the target on the training text (target.py), greedy rollouts of training-text prompts and their features
(rollouts.py), the drafter (distill.py), then greedy DFlash decoding of held-out prompts to estimate the commit
length SGLang will see. Writes WEIGHTS/target (config.json, model.safetensors, tokenizer files, reference.json,
specgate_model.json) and WEIGHTS/dflash (config.json, model.safetensors, tokenizer files), and
WEIGHTS/training.json (settings, step counts, timings, losses, acceptance), and WEIGHTS/frozen.jsonl (the frozen
boundary suite cut in the model's tokenizer). Step counts by default, so a run is bit-for-bit reproducible (one
torch thread, seeded); a step count of 0 trains for the phase's time budget instead.

The target is trained briefly on purpose: a tiny model trained for long writes less repetitive text, which a
drafter this small predicts worse (with a 706-step target, 1.1 accepted drafts per verify step in greedy DFlash
decoding of the CI test's cases; with the 250-step default, 2.6); what the gate needs from it is drafts that are
really accepted, not fluency.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.sglang_setup.model import WEIGHTS
from tests.sglang_setup.model.config import BLOCK_SIZE, DRAFTER_LAYERS, MASK_ID, drafter_config
from tests.sglang_setup.model.distill import DrafterConfig, DrafterTrainer
from tests.sglang_setup.model.drafter import DFlashDrafter
from tests.sglang_setup.model.rollouts import features, greedy_rollouts, prompts, speculate
from tests.sglang_setup.model.target import (
    TargetConfig,
    TargetTrainer,
    new_model,
    save,
    train_tokenizer,
    validation_loss,
)
from training.data import load_corpus
from workloads.corpus import HELDOUT_PATH

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
ROLLOUT_PROMPT_LENS = (64, 128, 256, 384)


def parse_args(argv=None) -> argparse.Namespace:
    t, d = TargetConfig(), DrafterConfig()
    ap = argparse.ArgumentParser(prog="python -m tests.sglang_setup.model", description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["build"])
    ap.add_argument("--out", type=Path, default=WEIGHTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    ap.add_argument("--target-steps", type=int, default=t.steps, help="target steps (0: --target-minutes)")
    ap.add_argument("--target-minutes", type=float, default=t.minutes, help="the target's time budget")
    ap.add_argument("--drafter-steps", type=int, default=d.steps, help="drafter steps (0: --drafter-minutes)")
    ap.add_argument("--drafter-minutes", type=float, default=d.minutes, help="the drafter's time budget")
    ap.add_argument("--target-from", type=Path, help="a target directory this command wrote: train the drafter only")
    ap.add_argument("--drafter-layers", type=int, default=DRAFTER_LAYERS)
    ap.add_argument("--rollouts", type=int, default=256)
    ap.add_argument("--rollout-tokens", type=int, default=256, help="greedy tokens per rollout")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(a.threads)
    started = time.monotonic()
    out, target_dir, drafter_dir = a.out, a.out / "target", a.out / "dflash"
    for d in (target_dir, drafter_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    report: dict = {"seed": a.seed, "threads": a.threads}

    # --- tokenizer and target ---------------------------------------------------------------------------
    corpus = load_corpus()
    train_text, val_text = corpus.train.numpy().tobytes().decode(), corpus.validation.numpy().tobytes().decode()
    tok = train_tokenizer(train_text, target_dir)
    tokens = torch.tensor(tok.encode(train_text).ids, dtype=torch.int16)
    val_tokens = torch.tensor(tok.encode(val_text).ids, dtype=torch.int16)
    report["corpus"] = {"train_bytes": len(train_text), "train_tokens": len(tokens), "train_files": corpus.train_files,
                        "bytes_per_token": round(len(train_text) / len(tokens), 3)}
    print(f"tokenizer: {report['corpus']}", flush=True)
    if a.target_from:
        model = load_target(a.target_from, target_dir)
        report["target"] = {**json.loads((a.target_from.parent / "training.json").read_text())["target"],
                            "copied_from": str(a.target_from)}
    else:
        tc = TargetConfig(minutes=a.target_minutes, steps=a.target_steps, seed=a.seed)
        model = new_model(a.seed)
        tt = TargetTrainer(model, tc, tokens.long())
        tt.train(lambda _t: None)
        save(model.eval(), target_dir)
        report["target"] = {"config": asdict(tc), "steps": tt.step, "seconds": round(tt.elapsed, 1),
                            "tokens": tt.step * tc.batch_size * tc.seq_len,
                            "params": sum(p.numel() for p in model.parameters()),
                            "validation_loss_nats": round(validation_loss(model, val_tokens.long()), 4),
                            "loss_history": tt.history[:: max(1, len(tt.history) // 30)]}
    print(f"target: {report['target']['steps']} steps, validation loss {report['target']['validation_loss_nats']}",
          flush=True)

    # --- rollouts and drafter ---------------------------------------------------------------------------
    t0 = time.monotonic()
    newline = {i for t, i in tok.get_vocab().items() if t.endswith("Ċ")}  # byte-level BPE's "\n"
    ro = greedy_rollouts(model, prompts(tokens, a.rollouts, ROLLOUT_PROMPT_LENS, newline, a.seed), a.rollout_tokens)
    ro.features = torch.cat([features(model, ro.ids[i:i + 8])[0] for i in range(0, len(ro.ids), 8)])
    report["rollouts"] = {"count": len(ro.ids), "tokens": a.rollout_tokens, "seconds": round(time.monotonic() - t0, 1)}
    print(f"rollouts: {report['rollouts']}", flush=True)
    dcfg = drafter_config(BLOCK_SIZE, a.drafter_layers)
    drafter = DFlashDrafter(dcfg)
    drafter.init_weights(a.seed)
    dc = DrafterConfig(minutes=a.drafter_minutes, steps=a.drafter_steps, seed=a.seed)
    dt = DrafterTrainer(drafter, dc, ro, model.get_input_embeddings().weight, model.get_output_embeddings().weight)
    dt.train(lambda _t: None)
    drafter.eval()
    report["drafter"] = {"config": asdict(dc), "steps": dt.step, "seconds": round(dt.elapsed, 1),
                         "params": sum(p.numel() for p in drafter.parameters()),
                         "loss_history": dt.history[:: max(1, len(dt.history) // 30)]}
    write_drafter(drafter, dcfg, target_dir, drafter_dir)

    # --- acceptance on held-out prompts, and the reference continuations ---------------------------------------
    held = torch.tensor(tok.encode(HELDOUT_PATH.read_text()).ids)
    starts = [k * len(held) // 9 for k in range(1, 9)]
    runs = [speculate(model, drafter, held[s:s + 200].tolist(), 64) for s in starts]
    commits = [c for r in runs for c in r["commits"]]
    report["acceptance"] = {"prompts": len(runs), "prompt_tokens": 200, "new_tokens": 64, "verify_steps": len(commits),
                            "mean_commit_length": round(sum(commits) / len(commits), 3),
                            "mean_accepted_drafts": round(sum(commits) / len(commits) - 1, 3)}
    print(f"simulated DFlash decoding on held-out prompts: {report['acceptance']}", flush=True)
    write_reference(model, held, target_dir)
    write_suite(target_dir, out / "frozen.jsonl")
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    (out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    write_card(target_dir, report)
    print(f"wrote {target_dir} and {drafter_dir} in {report['wall_seconds']:.0f}s", flush=True)
    return 0


def load_target(src: Path, out: Path):
    """A target this command wrote (its weights and config), copied to `out`; the model."""
    from transformers import AutoModelForCausalLM

    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(src / name, out / name)
    return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()


def write_drafter(drafter: DFlashDrafter, cfg: dict, target_dir: Path, out: Path) -> None:
    """config.json and model.safetensors (SGLang's names) and the target's tokenizer files."""
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    save_file({k: v.detach().contiguous() for k, v in drafter.state_dict().items()}, out / "model.safetensors")
    for name in TOKENIZER_FILES:
        shutil.copyfile(target_dir / name, out / name)


@torch.no_grad()
def write_reference(model, held: torch.Tensor, out: Path, n: int = 24) -> None:
    """reference.json: transformers' fp32 greedy continuation of three held-out prompts (ids, log-probs,
    top-1/top-2 margins), the oracle the contract test holds SGLang's answers to."""
    rows = []
    for k in range(3):
        prompt = held[k * len(held) // 4: k * len(held) // 4 + 48].tolist()
        gen = model.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        lps = [torch.log_softmax(lg[0].float(), -1) for lg in gen.logits]
        ids = gen.sequences[0, len(prompt):].tolist()
        top2 = [lp.topk(2).values for lp in lps]
        rows.append({"input_ids": prompt, "output_ids": ids,
                     "logprobs": [float(lp[t]) for lp, t in zip(lps, ids, strict=True)],
                     "margins": [float(t[0] - t[1]) for t in top2]})
    (out / "reference.json").write_text(json.dumps({"arch": "qwen3_next", "dtype": "float32",
                                                    "engine": "transformers", "continuations": rows}) + "\n")


def write_suite(target_dir: Path, path: Path) -> None:
    """The frozen boundary suite cut in the model's tokenizer (intervals 128 and 256, B = 8): what
    `python -m workloads.frozen --write --file PATH --tokenizer TARGET_DIR` writes."""
    from workloads.frozen import main as frozen

    frozen(["--write", "--file", str(path), "--tokenizer", str(target_dir)])


def write_card(target_dir: Path, report: dict) -> None:
    """specgate_model.json: what the harness's model card holds (the flags SGLang needs), plus the training."""
    card = {"arch": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "trained": True,
            "sglang_args": ["--dtype", "float32"], "vllm_args": ["--dtype", "bfloat16"],
            "params": report["target"]["params"], "mask_token_id": MASK_ID, "drafter": "../dflash",
            "built_with": "python -m tests.sglang_setup.model build"}
    (target_dir / "specgate_model.json").write_text(json.dumps(card, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
