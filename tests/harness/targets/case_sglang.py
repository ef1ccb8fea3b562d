"""SGLang's contract case: what a real SGLang 0.5.23 reports in /server_info for the flags each pool's replicas are
launched with (the keys and values of tests/harness/server_infos.py cpu_llama, recorded from one): on CPU a Llama
with its radix cache on and no mamba state (`uses_mamba_radix_cache: false`, the strategy left at `auto`, the
default interval 256, which the target does not take for a checkpoint interval)."""

from __future__ import annotations

import json
import shutil

from harness.targets.base import Reported
from protocol.hf_tokenizer import load_tokenizer
from tests.harness.fake_vllm import make_interpreter
from tests.harness.helpers import REPO
from tests.harness.targets.contract import Case

# what a GPU node runs (on SGLang's CPU path the target refuses DFLASH and extra_buffer before starting anything)
SPEC = ("--attention-backend fa3 --speculative-algorithm DFLASH --speculative-draft-model-path /drafter "
        "--speculative-dflash-block-size 8 --mamba-radix-cache-strategy extra_buffer")
UNKNOWN = ["spec_trace"]


def agreeing(pool, launch) -> dict:
    """The /server_info of an SGLang server started with the pool's flags (as the sglang backend's probe gives it):
    its model, radix cache, speculation, and mamba state only where the pool has an interval."""
    e = pool.engine
    model = launch.args[launch.args.index("--model-path") + 1] if launch is not None else None
    mamba = e.interval is not None
    info = {"model_path": model, "disable_radix_cache": not e.radix_cache,
            "speculative_algorithm": "DFLASH" if e.speculative else None,
            "speculative_dflash_block_size": e.block_size, "uses_mamba_radix_cache": mamba,
            "mamba_radix_cache_strategy": e.strategy if mamba else "auto",
            "mamba_track_interval": e.interval if mamba else 256,
            "specgate_probe": {"backend": "sglang", "unknown": list(UNKNOWN)}}
    return info


def reported(pool) -> Reported:
    e = pool.engine
    mamba = e.interval is not None
    return Reported(e.interval, e.block_size, e.strategy if mamba else None, e.speculative, e.radix_cache, None,
                    None, None, tuple(UNKNOWN))


def case(tmp_path) -> Case:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 300}))
    (model / "specgate_model.json").write_text(json.dumps({"sglang_args": ["--dtype", "float32"]}))
    shutil.copy(REPO / "protocol" / "data" / "byte_tokenizer" / "tokenizer.json", model / "tokenizer.json")
    served = str(model.resolve())
    cand = {"model_path": served, "disable_radix_cache": False, "speculative_algorithm": None,
            "uses_mamba_radix_cache": False, "mamba_radix_cache_strategy": "auto", "mamba_track_interval": 256}
    return Case(
        argv=["--engine", "sglang", "--model", str(model), "--sglang-python", make_interpreter(tmp_path / "bin"),
              "--concurrency", "4"],
        pools=["sglang", "reference"],
        agreeing=agreeing, reported=reported,
        contradicting=[
            ("sglang", {**cand, "disable_radix_cache": True},
             "pool sglang: asked for the radix cache on, the server reports disable_radix_cache true"),
            ("sglang", {**cand, "speculative_algorithm": "EAGLE"},
             'pool sglang: asked for no speculation, the server reports speculative_algorithm "EAGLE"'),
            ("sglang", {**cand, "model_path": "/elsewhere/llama"},
             "pool sglang: the server serves model_path /elsewhere/llama, not the run's --model"),
            ("reference", {**cand, "disable_radix_cache": False},
             "pool reference: asked for the radix cache off (--disable-radix-cache), the server reports "
             "disable_radix_cache false")],
        workload=((128, 256), 8, load_tokenizer(str(model)).name),  # the model directory's tokenizer
        candidate_args=["--candidate-args", SPEC],
        refused=[(["--backend", "openai"], "--engine sglang speaks SGLang's native /generate"),
                 (["--inject-fault", "stale-seq-lens"], "--inject-fault applies to the built-in engine"),
                 (["--candidate-args", "--port 1"], "--candidate-args: --port is set by the harness"),
                 (["--candidate-args=--disable-radix-cache"],
                  "--candidate-args: --disable-radix-cache is set by the harness; use the harness flag --calibrate"),
                 (["--device", "cpu", "--candidate-args",
                   "--speculative-algorithm DFLASH --speculative-dflash-block-size 8"],
                  "--candidate-args: SGLang's CPU platform refuses --speculative-algorithm DFLASH"),
                 (["--device", "cpu", "--candidate-args", "--mamba-radix-cache-strategy extra_buffer"],
                  "--candidate-args: SGLang's CPU platform refuses"),
                 (["--candidate-args", "--tp 2"], "--candidate-args: --tp (short for --tp-size) is set by the "
                  "harness from --tp-size"),
                 (["--candidate-args", "--device cuda"], "--candidate-args: --device is set by the harness"),
                 (["--endpoint", "http://h:1", "--reference-endpoint", "http://h:2"],
                  "--engine sglang starts SGLang replicas under Ray")],
    )
