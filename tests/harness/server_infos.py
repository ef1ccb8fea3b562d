"""Recorded SGLang /server_info payloads, trimmed to the keys specgate reads, for the stub servers.

Key names and value shapes are SGLang's: its native-API docs print a full
/server_info (sgl-project/sglang, docs/basic_usage/native_api.ipynb, April 2026:
`"speculative_num_draft_tokens":null,"speculative_dflash_block_size":null,...,
"mamba_scheduler_strategy":"no_buffer","mamba_track_interval":256,...,
"incremental_streaming_output":false`); python/sglang/srt/server_args.py names the
strategy choices (auto, no_buffer, extra_buffer, extra_buffer_lazy) and, since the
mid-2026 rename, `mamba_radix_cache_strategy`; DFlash's `_handle_dflash` sets
`speculative_num_draft_tokens` from `--speculative-dflash-block-size`, which older
builds did not. The interval and block size are the test's, so they match the
fake server's behaviour. `cpu_llama` is what a real SGLang 0.5.23 reported, on CPU
serving the tiny Llama of `python -m harness.models build --arch llama`
(tests/harness/test_sglang_contract.py checks every key here against a live one).
"""

from __future__ import annotations

import json
from pathlib import Path

COMMON = {
    "model_path": "Qwen/Qwen3.5-35B-A3B", "tokenizer_path": "Qwen/Qwen3.5-35B-A3B", "tokenizer_mode": "auto",
    "served_model_name": "Qwen/Qwen3.5-35B-A3B", "tp_size": 1, "dp_size": 1, "page_size": 1,
    "max_running_requests": 48, "disable_radix_cache": False, "speculative_algorithm": "DFLASH",
    "speculative_draft_model_path": "z-lab/Qwen3.5-35B-A3B-DFlash", "speculative_num_steps": 1,
    "speculative_eagle_topk": 1, "mamba_ssm_dtype": None, "mamba_full_memory_ratio": 0.9,
    "linear_attn_backend": "triton", "enable_deterministic_inference": True, "status": "ready",
}


def older(interval: int, block: int) -> dict:
    """(a) An SGLang build with only /get_server_info: `mamba_scheduler_strategy`, block size only as
    speculative_dflash_block_size (speculative_num_draft_tokens unset)."""
    return {**COMMON, "speculative_num_draft_tokens": None, "speculative_dflash_block_size": block,
            "mamba_scheduler_strategy": "extra_buffer", "mamba_track_interval": interval}


def current(interval: int, block: int, incremental: bool = False, strategy: str = "extra_buffer") -> dict:
    """(b) A current build: `mamba_radix_cache_strategy`, both block-size keys; (d) with incremental streaming."""
    return {**COMMON, "speculative_num_draft_tokens": block, "speculative_dflash_block_size": block,
            "mamba_radix_cache_strategy": strategy, "uses_mamba_radix_cache": True, "mamba_track_interval": interval,
            "incremental_streaming_output": incremental, "stream_interval": 1}


def cpu_llama(model_path: str = "/models/llama", incremental: bool = False) -> dict:
    """(e) A real SGLang 0.5.23 on CPU serving a Llama (`--device cpu --attention-backend torch_native --dtype
    float32`): no speculation reported as null, and a non-hybrid model's mamba settings left at their defaults
    (strategy `auto`, unresolved, interval 256) with `uses_mamba_radix_cache: false`."""
    return {
        "model_path": model_path, "tokenizer_path": model_path, "tokenizer_mode": "auto",
        "served_model_name": model_path, "tp_size": 1, "dp_size": 1, "page_size": 1, "max_running_requests": None,
        "disable_radix_cache": False, "speculative_algorithm": None, "speculative_draft_model_path": None,
        "speculative_num_steps": None, "speculative_eagle_topk": None, "speculative_num_draft_tokens": None,
        "speculative_dflash_block_size": None, "mamba_ssm_dtype": None, "mamba_full_memory_ratio": 0.9,
        "mamba_radix_cache_strategy": "auto", "uses_mamba_radix_cache": False, "mamba_track_interval": 256,
        "linear_attn_backend": "triton", "enable_deterministic_inference": False,
        "incremental_streaming_output": incremental, "stream_interval": 1, "dtype": "float32", "device": "cpu",
        "attention_backend": "torch_native", "status": "ready", "version": "0.5.23",
    }


def write(path: Path, payload: dict) -> str:
    path.write_text(json.dumps(payload))
    return str(path)
