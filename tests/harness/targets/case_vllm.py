"""vLLM's contract case: what the OpenAI backend's probe reads from a vLLM server's /metrics (harness/backends/
metrics.py vllm_settings: block 16 from vllm:cache_config_info, 4 drafts + 1 from the spec_decode positions)."""

from __future__ import annotations

import json
import shutil

from harness.targets.base import Reported
from protocol.hf_tokenizer import load_tokenizer
from tests.harness.fake_vllm import make_interpreter
from tests.harness.helpers import REPO
from tests.harness.targets.contract import Case

SPEC = '{"method": "ngram", "num_speculative_tokens": 4}'
BLOCK = 16


def agreeing(pool, launch) -> dict:
    """The settings a vLLM server started with the pool's flags reports (as the OpenAI backend's probe gives them)."""
    e = pool.engine
    info = {"speculative_algorithm": "VLLM" if e.speculative else "NONE", "disable_radix_cache": not e.radix_cache,
            "specgate_probe": {"backend": "openai", "declared": [], "unknown": ["spec_trace", "spec_verify_ct"]}}
    if e.speculative:
        info["speculative_num_draft_tokens"] = e.block_size
    if e.radix_cache:
        info.update(mamba_track_interval=BLOCK, mamba_radix_cache_strategy="vllm-align")
    return info


def reported(pool) -> Reported:
    e = pool.engine
    return Reported(BLOCK if e.radix_cache else None, e.block_size, "vllm-align" if e.radix_cache else None,
                    e.speculative, e.radix_cache, None, None, None, ("spec_trace", "spec_verify_ct"))


def case(tmp_path) -> Case:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "specgate_model.json").write_text(json.dumps({"vllm_args": ["--dtype", "float32"]}))
    shutil.copy(REPO / "protocol" / "data" / "byte_tokenizer" / "tokenizer.json", model / "tokenizer.json")
    cached_off = {"speculative_algorithm": "VLLM", "speculative_num_draft_tokens": 5, "disable_radix_cache": True,
                  "specgate_probe": {"declared": []}}
    return Case(
        argv=["--engine", "vllm", "--model", str(model), "--vllm-python", make_interpreter(tmp_path / "bin"),
              "--candidate-args", f"--enable-prefix-caching --speculative-config '{SPEC}'", "--concurrency", "4"],
        pools=["vllm", "baseline", "reference"],  # a noisy target: its calibration baseline is automatic
        agreeing=agreeing, reported=reported,
        contradicting=[("vllm", cached_off, "pool vllm: asked for prefix caching on, the server reports it off"),
                       ("vllm", {**cached_off, "disable_radix_cache": False, "speculative_algorithm": "NONE"},
                        "pool vllm: asked for speculative decoding, the server's /metrics show none")],
        workload=((128, 256), 8, load_tokenizer(str(model)).name),  # the model directory's tokenizer
        candidate_args=["--candidate-args", f"--no-enable-prefix-caching --speculative-config '{SPEC}'"],
        refused=[(["--backend", "sglang"], "--engine vllm speaks vLLM's OpenAI API"),
                 (["--inject-fault", "stale-seq-lens"], "--inject-fault applies to the built-in engine"),
                 (["--candidate-args", "--port 1"], "--candidate-args: --port is set by the harness")],
    )
