"""The built-in engine's contract case: what engine.serve reports is its EngineConfig (engine/engine.py
server_info), built here from the very config each pool's replicas are launched with."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.server.served_model import served_model
from harness.targets.base import Reported
from tests.harness.targets.contract import Case


def agreeing(pool, launch) -> dict:
    """engine.serve's /server_info for the EngineConfig the pool's replicas are started with."""
    cfg = EngineConfig(**launch.engine_cfg)
    return {**cfg.to_dict(), "tokenizer": "byte", "tokenizer_path": served_model(cfg).tokenizer_dir}


def reported(pool) -> Reported:
    e = pool.engine
    tokenizer_dir = served_model(EngineConfig(**_launch_of_i128().engine_cfg)).tokenizer_dir
    return Reported(e.interval if e.radix_cache else 128, e.block_size, e.strategy, e.speculative, e.radix_cache,
                    "byte", tokenizer_dir)  # the reference's interval: unused, the flags' first


def case(tmp_path) -> Case:
    info = agreeing(None, _launch_of_i128())
    return Case(
        argv=["--intervals", "128,256", "--concurrency", "4"],
        pools=["i128", "i256", "reference"],
        agreeing=agreeing, reported=reported,
        contradicting=[("i128", dict(info, mamba_track_interval=256),
                        "pool i128: the server reports mamba_track_interval 256"),
                       # a neighbour answering on the address (two replicas handed one port): the reference for the
                       # candidate, the candidate for the reference, a faulty candidate for a clean one
                       ("i128", agreeing(None, _launch_of("reference")),
                        "pool i128: the server at http://i128-r0 reports speculative_algorithm 'NONE'"),
                       ("reference", info, "pool reference: the server at http://reference-r0 reports "
                        "speculative_algorithm 'DFLASH'"),
                       ("i128", dict(info, inject_fault="stale-seq-lens"), "reports inject_fault 'stale-seq-lens', "
                        "where this pool's replicas were started with None: another server answers there")],
        workload=((128, 256), 8, "byte"),
        candidate_args=["--candidate-args", "--max-state-slots 12"],
        refused=[(["--backend", "openai"], "--backend openai drives already-running servers"),
                 (["--candidate-args", "--mamba-track-interval 64"],
                  "--candidate-args: --mamba-track-interval is set by the harness"),
                 (["--cover", "--suite", "load"], "--cover runs its own suite"),
                 (["--candidate-args", "--device cuda"], "--candidate-args: --device is set by the harness for "
                  "each pool; use the harness flag --device (every pool and rank)")],
    )


def _launch_of_i128():
    return _launch_of("i128")


def _launch_of(name: str):
    from harness.cli import from_argv
    from harness.placement import CPU
    from harness.targets import make_target

    target = make_target(from_argv(["--intervals", "128,256"], {})[0])
    plan = target.plan([], {})
    return target.launch(next(p for p in (*plan.candidates, plan.reference) if p.name == name), CPU)
