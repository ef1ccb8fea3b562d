"""SGLang under Ray (`--engine sglang`): `python -m sglang.launch_server` from its own venv, pools from its flags.

SGLang lives in its own virtual environment (`make sglang` builds `.venv-sglang`,
with the CPU stand-ins of tests/sglang_setup; shared/reference/sglang-cpu.md):
specgate never imports it, it starts SGLang's server in the Ray replica actors and
speaks SGLang's native /generate to it (the sglang backend). The pools and their
flags are sglang_profile.py's: a candidate with the radix cache on and
`--candidate-args`, a cold reference. Once the servers are up, each is probed
(/server_info, one short request): a server that runs something else than its pool
asked for (radix cache, speculation, strategy, model) stops the run with a message
that says so, and each candidate's interval, block size and strategy become what
its servers report. A candidate that does not speculate (SGLang's CPU platform
refuses DFLASH and extra_buffer) is said so in the log, and its report narrows:
no verify steps, no speculation cells. The workload is built in the --model
directory's tokenizer, and every id it sends must be below the model's vocabulary
(a real SGLang scheduler dies on an id >= vocab_size).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from harness.backends import PROBE_KEY, Backend, ReplicaFailure, RequestError
from harness.backends.info import GATED_STRATEGIES, speculative, strategy_of, track_interval
from harness.backends.sglang import SGLangBackend
from harness.errors import ConfigError, HarnessError
from harness.plan import Plan, PoolPlan
from harness.targets.base import Need, Reported, reported_settings
from harness.targets.managed import Launch, ProfileTarget
from harness.targets.sglang_profile import (
    BOOTSTRAP,
    CPU_FLAGS,
    SGLangArgsError,
    check_args,
    describe,
    engine_spec,
    environment,
    make_pool,
    pools,
    server_args,
    value_of,
)
from harness.targets.venv import Venv, find_python
from harness.targets.vllm import probe_replica
from harness.workload import WorkloadTarget, suite_flag
from reports.gate import GateThresholds

if TYPE_CHECKING:
    from harness.config import RunConfig

VENV = Venv("SGLang", "--sglang-python", "SPECGATE_SGLANG_PYTHON", (".venv-sglang/bin/python",),
            "`make sglang` (creates .venv-sglang, about 10 minutes and 3.4 GB)")
CPU_REFUSES = ("SGLang's CPU platform refuses --speculative-algorithm DFLASH and --mamba-radix-cache-strategy "
               "extra_buffer (docs/gate-sglang.md, section 4)")
SUMMARY_KEYS = ("model_path", "disable_radix_cache", "speculative_algorithm", "uses_mamba_radix_cache",
                "mamba_radix_cache_strategy", "mamba_track_interval", "version")


def vocab_size(model_dir: str) -> int | None:
    """The model's vocabulary size (config.json `vocab_size`, or its text config's), None when it does not say."""
    try:
        config = json.loads((Path(model_dir).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(value) if isinstance(value, int) and value > 0 else None


def largest_id(sessions: list) -> int:
    """The largest token id any turn of `sessions` sends (-1 for none)."""
    ids = [max(ids) for s in sessions for t in s.turns for ids in (t.input_ids, t.suffix_ids) if ids]
    return max(ids, default=-1)


def summary(infos: dict[str, dict]) -> str:
    """One line per server: what it reported (for the log)."""
    return "\n".join(f"  {url}: " + json.dumps({k: info.get(k) for k in SUMMARY_KEYS}) for url, info in infos.items())


def check_flags(name: str, asked, info: dict, model_path: str) -> str | None:
    """Why a server's /server_info contradicts what its pool asked (`asked`: an SGLangPool); None when it agrees."""
    if "disable_radix_cache" in info and (not info["disable_radix_cache"]) != asked.radix_cache:
        return (f"pool {name}: asked for the radix cache {'on' if asked.radix_cache else 'off (--disable-radix-cache)'}"
                f", the server reports disable_radix_cache {json.dumps(info['disable_radix_cache'])}")
    if asked.speculative != speculative(info):
        return (f"pool {name}: asked for {'speculative decoding' if asked.speculative else 'no speculation'}, the "
                f"server reports speculative_algorithm {json.dumps(info.get('speculative_algorithm'))}")
    strategy = strategy_of(info)
    if asked.strategy and info.get("uses_mamba_radix_cache") is not False and strategy not in (None, asked.strategy):
        return f"pool {name}: asked for mamba radix cache strategy {asked.strategy}, the server reports {strategy}"
    served = info.get("model_path")
    if served is not None and Path(str(served)).expanduser().resolve() != Path(model_path).expanduser().resolve():
        return f"pool {name}: the server serves model_path {served}, not the run's --model {model_path}"
    return None


class SGLangTarget(ProfileTarget):
    """SGLang's native server; each pool's settings are what its servers report once they are up."""

    key = "sglang"
    controls = frozenset({"candidate_args", "calibrate"})
    default_backend = "sglang"
    venv = VENV
    # SGLang's CPU path in fp32 (the model card's --dtype): radix-cached and cold answers agree to float noise
    # (6.9e-06 at most, measured at concurrency 4 with the built Llama), so the built-in engine's tolerance holds;
    # --candidate-args with another dtype wants --calibrate or --drift-tolerance
    drift_tolerance = GateThresholds().drift_tolerance

    @classmethod
    def validate(cls, cfg: RunConfig, need: Need) -> None:
        """A local model directory, the sglang backend, SGLang's own flags in --candidate-args, nothing that only
        the built-in engine has."""
        need(not cfg.external, "--engine sglang starts SGLang replicas under Ray; for already-running servers give "
             "--endpoint / --reference-endpoint (--backend sglang) instead")
        need(cfg.backend == "sglang", f"--engine sglang speaks SGLang's native /generate: drop --backend {cfg.backend}")
        need(Path(cfg.model_path).expanduser().joinpath("config.json").is_file(),
             f"--model {cfg.model_path}: not a model directory with a config.json (build one with "
             "`python -m harness.models build DIR --arch llama`)")
        for name in ("inject_fault", "page_size"):
            need(not getattr(cfg, name), f"--{name.replace('_', '-')} applies to the built-in engine, not --engine "
                 "sglang")
        need(cfg.tp_size == 1, "--tp-size: --engine sglang runs one rank per replica (1)")
        try:
            check_args(cfg.candidate_args)
        except SGLangArgsError as e:
            need(False, f"--candidate-args: {e}")
        asked = make_pool("sglang", "candidate", cfg.candidate_args)
        cpu = value_of((*CPU_FLAGS, *cfg.candidate_args), "--device") == "cpu"
        need(not cpu or not (asked.speculative or asked.strategy in GATED_STRATEGIES),
             f"--candidate-args: {CPU_REFUSES}, and the servers run SGLang's CPU path (--device cpu): drop the "
             "speculation and strategy flags (the candidate then gates the radix cache alone), or give SGLang's "
             "GPU flags (--device cuda --attention-backend ...) on a GPU node")

    # --- workload -------------------------------------------------------------------------------------------
    def sessions(self, target: WorkloadTarget) -> tuple[list, int]:
        """The workload's sessions; ConfigError when one sends an id outside the model's vocabulary."""
        sessions, left_out = super().sessions(target)
        vocab, top = vocab_size(self.cfg.model_path), largest_id(sessions)
        if vocab is not None and top >= vocab:
            raise ConfigError(f"{suite_flag(self.cfg)}: the workload sends token id {top}, and the model's vocabulary "
                              f"has {vocab} ids (a real SGLang scheduler dies on it): build the workload in the "
                              "model's own tokenizer (its directory, or --tokenizer with its tokenizer.json)")
        return sessions, left_out

    # --- pools ----------------------------------------------------------------------------------------------
    def python_flag(self) -> str | None:
        return self.cfg.sglang_python

    def profile_pools(self) -> tuple[list, object]:
        """sglang_profile.pools: with --calibrate the `baseline` pool."""
        return pools(self.cfg.candidate_args, self.cfg.calibrate)

    def engine_spec(self, pool) -> object:
        return engine_spec(pool)

    def describe_pools(self, python: str, cands: list, ref, n_sessions: int) -> str:
        text = describe(self.cfg, python, cands, ref, n_sessions)
        if any(p.radix_cache and not p.speculative for p in cands):
            text += (f"\nno speculation on a candidate: {CPU_REFUSES} on CPU; the report narrows (radix-cache hits "
                     "are gated, verify steps and speculation cells are not)")
        return text

    # --- servers --------------------------------------------------------------------------------------------
    def launch(self, pool: PoolPlan) -> Launch:
        """SGLang's server from its venv (or --server-command) with the pool's flags; the API key comes from the
        replica's environment through sglang_profile.BOOTSTRAP."""
        command = self.cfg.server_command or (find_python(VENV, self.cfg.sglang_python), "-c", BOOTSTRAP)
        args = server_args(self.cfg.model_path, make_pool(pool.name, pool.role, pool.engine.args))
        return Launch(tuple(command), tuple(args), None, environment)

    def backend(self, api_key: str) -> Backend:
        """SGLang's native backend with the run's key and the model directory as the tokenizer."""
        return SGLangBackend(api_key, self.cfg.tokenizer or self.cfg.model_path)

    def log_dir(self, run_dir: Path) -> str | None:
        """RUN_DIR/logs on a local Ray (SGLang's logs are what a failed start is read from)."""
        return str(run_dir.resolve() / "logs") if not self.cfg.address else None

    def reported(self, info: dict) -> Reported:
        """What an SGLang server runs: no checkpoint interval nor strategy where it uses no mamba radix cache."""
        r = reported_settings(info)
        interval = track_interval(info)
        return dataclasses.replace(r, interval=interval, strategy=r.strategy if interval is not None else None)

    def settle(self, plan: Plan, cands: list, ref, infos: dict[str, dict]) -> tuple[Plan, dict[str, dict]]:
        """Probe every replica; a server that contradicts its pool stops the run. Each candidate's interval, block
        size and strategy become what its servers report; a candidate without speculation narrows the report."""
        try:
            infos = asyncio.run(self._probe_pools(cands, ref))
        except (RequestError, ReplicaFailure) as e:
            raise HarnessError(str(e)) from None
        print("SGLang servers report:\n" + summary(infos))
        for pool in cands:  # the candidate proper (a --calibrate baseline is cold by design)
            if pool.engine.radix_cache and not pool.engine.speculative:
                print(f"pool {pool.name}: no speculation ({CPU_REFUSES} on CPU); the report narrows: radix-cache "
                      "hits are gated, verify steps and speculation cells are not")
        engines = {p.name: p.engine for p in cands}
        fixed = tuple(PoolPlan(p.name, p.role, engines[p.name], p.replicas, p.sessions) for p in plan.candidates)
        return dataclasses.replace(plan, candidates=fixed), infos

    async def _probe_pools(self, cands: list, ref) -> dict[str, dict]:
        infos: dict[str, dict] = {}
        async with aiohttp.ClientSession() as http:
            for pool in (*cands, ref):
                asked = make_pool(pool.name, pool.role, pool.engine.args)
                for r in pool.replicas:
                    info = await probe_replica(pool.backend, http, r.url, pool.role)
                    problem = check_flags(pool.name, asked, info, self.cfg.model_path)
                    if problem:
                        raise RequestError(problem)
                    if pool.role == "candidate" and asked.radix_cache and not speculative(info):
                        record = info.setdefault(PROBE_KEY, {})
                        record["unknown"] = [*record.get("unknown", []), "speculation"]
                    infos[r.url] = info
                pool.server_info = infos[pool.replicas[0].url]
                got = self.reported(pool.server_info)
                pool.engine = engine_spec(asked, got.interval, got.block_size, got.strategy)
        return infos

    def check_reported(self, pool, url: str, info: dict) -> str | None:
        return (check_flags(pool.name, make_pool(pool.name, pool.role, pool.engine.args), info, self.cfg.model_path)
                or super().check_reported(pool, url, info))
