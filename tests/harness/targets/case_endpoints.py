"""The endpoints' contract case: recorded SGLang /server_info payloads (tests/harness/server_infos.py) as the
probe returns them; the candidates report intervals 128 and 256, the reference the cold path."""

from __future__ import annotations

from harness.targets.base import Reported
from tests.harness import server_infos
from tests.harness.targets.contract import Case

A, B, R = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"
REFERENCE = {**server_infos.COMMON, "speculative_algorithm": None, "disable_radix_cache": True,
             "mamba_track_interval": 256, "tokenizer": "byte"}
INFOS = {A: {**server_infos.current(128, 4), "tokenizer": "byte"},
         B: {**server_infos.older(256, 4), "tokenizer": "byte"}, R: REFERENCE}


def agreeing(pool, launch) -> dict:
    """What the pool's (first) endpoint reported when it was probed."""
    return pool.server_infos[0]


def reported(pool) -> Reported:
    path = server_infos.COMMON["tokenizer_path"]
    if pool.role == "reference":
        return Reported(256, None, None, False, False, "byte", path)
    return Reported(pool.engine.interval, 4, "extra_buffer", True, True, "byte", path)


def case(tmp_path) -> Case:
    return Case(
        argv=["--endpoint", A, "--endpoint", B, "--reference-endpoint", R, "--concurrency", "4"],
        pools=["i128", "i256", "reference"],
        agreeing=agreeing, reported=reported, infos=INFOS,
        contradicting=[("i128", REFERENCE, f"endpoint {A}: a candidate must run speculative decoding"),
                       ("reference", INFOS[A], f"reference endpoint {R}: the oracle must run without speculation")],
        workload=((128, 256), 4, "byte"),
        refused=[(["--diagnose"], "--diagnose configures built-in replicas"),
                 (["--candidate-args", "--max-state-slots 12"], "--candidate-args configures built-in replicas"),
                 (["--calibrate"], "--calibrate needs --engine builtin or vllm")],
    )
