"""SGLang under Ray (`--engine sglang`): `python -m sglang.launch_server` from its own venv, pools from its flags.

SGLang lives in its own virtual environment (`make sglang` builds `.venv-sglang`,
with the CPU stand-ins of tests/sglang_setup; shared/reference/sglang-cpu.md):
specgate never imports it, it starts SGLang's server in the Ray replica actors and
speaks SGLang's native /generate to it (the sglang backend). The pools and their
flags are sglang_profile.py's: a candidate with the radix cache on and
`--candidate-args`, a cold reference, each server at `--tp-size` ranks in the GPU or
the CPU profile, as its replica's placement chooses. Once the servers are up, each is probed
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

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.backends import PROBE_KEY, Backend
from harness.backends.info import GATED_STRATEGIES, speculative, strategy_of, track_interval
from harness.backends.sglang import SGLangBackend
from harness.errors import ConfigError, HarnessError
from harness.plan import EngineSpec, PoolPlan
from harness.settings import Need, setting
from harness.targets.base import DETERMINISTIC_FLAG, Reported, reported_settings
from harness.targets.managed import Devices, Launch, ManagedSettings
from harness.targets.profile import ProfileTarget, command_line, profile_for
from harness.targets.sglang_profile import (
    BOOTSTRAP,
    CPU,
    GPU,
    SGLangArgsError,
    check_args,
    engine_spec,
    make_pool,
    node_paths,
    pools,
    server_args,
    value_of,
)
from harness.targets.venv import Venv, find_python
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


def cpu_problem(candidate_args: tuple[str, ...]) -> str | None:
    """Why the candidate's flags cannot run on SGLang's CPU path, None when they can."""
    asked = make_pool("sglang", "candidate", candidate_args)
    if not (asked.speculative or asked.strategy in GATED_STRATEGIES):
        return None
    return (f"{CPU_REFUSES}, and the servers run SGLang's CPU path (--device cpu, or a cluster without GPUs): drop "
            "the speculation and strategy flags (the candidate then gates the radix cache alone), or run on GPUs "
            "(--device cuda)")


@dataclass(frozen=True)
class SGLangSettings(ManagedSettings):
    """SGLang's own settings: its interpreter."""

    key = "sglang"

    sglang_python: str | None = setting(None, "str", "--engine sglang: the SGLang venv's interpreter (default "
                                        "$SPECGATE_SGLANG_PYTHON, else .venv-sglang/bin/python from `make sglang`)",
                                        resume="runs")

    @property
    def noisy(self) -> bool:
        """SGLang's CPU path in fp32 (the model card's --dtype): radix-cached and cold answers agree to float noise
        (6.9e-06 at most, measured at concurrency 4 with the built Llama), so the built-in engine's tolerance
        holds; --candidate-args with another dtype wants --calibrate or --drift-tolerance."""
        return False

    @property
    def drift_tolerance(self) -> float:
        return GateThresholds().drift_tolerance

    def refused(self, name: str, offered_by: tuple[str, ...]) -> str:
        if name in ("endpoint", "reference_endpoint"):
            return ("--engine sglang starts SGLang replicas under Ray; for already-running servers give --endpoint "
                    "/ --reference-endpoint (--backend sglang) instead")
        if offered_by == ("builtin",):
            return f"--{name.replace('_', '-')} applies to the built-in engine, not --engine sglang"
        return super().refused(name, offered_by)

    def validate(self, run: RunConfig, need: Need) -> None:
        """A local model directory, the sglang backend, SGLang's own flags in --candidate-args (none that SGLang's
        CPU path refuses when the run is on CPU)."""
        super().validate(run, need)
        need(run.backend == "sglang", f"--engine sglang speaks SGLang's native /generate: drop --backend "
             f"{run.backend}")
        need(Path(self.model_path).expanduser().joinpath("config.json").is_file(),
             f"--model {self.model_path}: not a model directory with a config.json (build one with "
             "`python -m harness.models build DIR --arch llama`)")
        try:
            check_args(self.candidate_args)
        except SGLangArgsError as e:
            need(False, f"--candidate-args: {e}")
        problem = cpu_problem(self.candidate_args) if run.device == "cpu" else None
        need(problem is None, f"--candidate-args: {problem}")


class SGLangTarget(ProfileTarget):
    """SGLang's native server; each pool's settings are what its servers report once they are up."""

    settings_class = SGLangSettings
    settings: SGLangSettings
    venv = VENV
    summary_keys = SUMMARY_KEYS

    # --- workload -------------------------------------------------------------------------------------------
    def sessions(self, target: WorkloadTarget) -> tuple[list, int]:
        """The workload's sessions; ConfigError when one sends an id outside the model's vocabulary."""
        sessions, left_out = super().sessions(target)
        vocab, top = vocab_size(self.settings.model_path), largest_id(sessions)
        if vocab is not None and top >= vocab:
            raise ConfigError(f"{suite_flag(self.cfg)}: the workload sends token id {top}, and the model's vocabulary "
                              f"has {vocab} ids (a real SGLang scheduler dies on it): build the workload in the "
                              "model's own tokenizer (its directory, or --tokenizer with its tokenizer.json)")
        return sessions, left_out

    # --- the profile ----------------------------------------------------------------------------------------
    def python_flag(self) -> str | None:
        return self.settings.sglang_python

    def profile_pools(self) -> tuple[list, object]:
        """sglang_profile.pools: with --calibrate the `baseline` pool."""
        return pools(self.settings.candidate_args, self.cfg.calibrate)

    def asked(self, name: str, role: str, args: tuple[str, ...]):
        return make_pool(name, role, args)

    def engine_spec(self, asked, reported: Reported | None = None) -> EngineSpec:
        """The pool's EngineSpec; interval, block size and strategy are what its servers report, once known."""
        if reported is None:
            return engine_spec(asked, self.cfg.tp_size)
        return engine_spec(asked, self.cfg.tp_size, reported.interval, reported.block_size, reported.strategy)

    def contradiction(self, name: str, asked, info: dict) -> str | None:
        return check_flags(name, asked, info, self.settings.model_path)

    def server_line(self, python: str, asked, devices: Devices) -> str:
        return command_line(python, "sglang.launch_server", self.pool_args(asked, devices)) + " --api-key <run key>"

    def pool_args(self, asked, devices: Devices) -> list[str]:
        """Every flag of an asked pool's servers on `devices` (sglang_profile.server_args), with --deterministic's
        --enable-deterministic-inference on every pool."""
        args = server_args(self.settings.model_path, asked, profile_for(devices, GPU, CPU), self.cfg.tp_size)
        return args + ([DETERMINISTIC_FLAG] if self.cfg.deterministic and DETERMINISTIC_FLAG not in args else [])

    def pool_line(self, asked) -> str:
        return ", ".join([f"speculation {value_of(asked.args, '--speculative-algorithm')}" if asked.speculative
                          else "no speculation", "radix cache" if asked.radix_cache else "no radix cache"]
                         + ([f"strategy {asked.strategy}"] if asked.strategy else []))

    def notes(self, asked_pools: list) -> list[str]:
        lines = [f"  environment on {p.name}: {p.env_line}" for p in self.profiles()]
        problem = cpu_problem(self.settings.candidate_args) if CPU in self.profiles() else None
        lines += [f"  on CPU the candidate is refused before anything starts: {problem}"] if problem else []
        lines += ["  the key reaches --api-key from SPECGATE_API_KEY, never a command line",
                  "at start: each server's /server_info is read back (radix cache, speculation, strategy, track "
                  "interval, model path" + (", enable_deterministic_inference" if self.cfg.deterministic else "")
                  + "); a server that runs something else than its pool asked stops the run"]
        if any(p.role == "candidate" and p.radix_cache and not p.speculative for p in asked_pools):
            lines.append(f"no speculation on a candidate: {CPU_REFUSES} on CPU; the report narrows (radix-cache hits "
                         "are gated, verify steps and speculation cells are not)")
        return lines

    def noted(self, pool, asked, info: dict) -> dict:
        """A candidate with the radix cache that does not speculate cannot report speculation: listed as unknown."""
        if pool.role == "candidate" and asked.radix_cache and not speculative(info):
            record = info.setdefault(PROBE_KEY, {})
            record["unknown"] = [*record.get("unknown", []), "speculation"]
        return info

    def settled_notes(self, cands: list) -> list[str]:
        why = "its flags ask for none" if self.devices is not None and self.devices.on_gpu else f"{CPU_REFUSES} on CPU"
        return [f"pool {pool.name}: no speculation ({why}); the report narrows: radix-cache hits are gated, verify "
                "steps and speculation cells are not" for pool in cands if pool.engine.radix_cache
                and not pool.engine.speculative]

    # --- servers --------------------------------------------------------------------------------------------
    def profiles(self) -> list:
        """The profiles --dry-run shows (GPU, CPU, or both where --device is auto)."""
        return [profile_for(d, GPU, CPU) for d in self.dry_run_devices()]

    def launch(self, pool: PoolPlan, devices: Devices) -> Launch:
        """SGLang's server from its venv (or --server-command) with the pool's flags in the profile of `devices`;
        the API key comes from the replica's environment through sglang_profile.BOOTSTRAP. HarnessError: the
        candidate's flags on a CPU cluster SGLang's CPU path refuses."""
        s = self.settings
        problem = cpu_problem(s.candidate_args) if not devices.on_gpu and pool.role == "candidate" else None
        if problem:
            raise HarnessError(f"--candidate-args: {problem}")
        command = s.server_command or (find_python(VENV, s.sglang_python), "-c", BOOTSTRAP)
        args = self.pool_args(make_pool(pool.name, pool.role, pool.engine.args), devices)
        return Launch(tuple(command), tuple(args), None, profile_for(devices, GPU, CPU).environment)

    def node_paths(self, pool: PoolPlan) -> tuple[tuple[str, str], ...]:
        return node_paths(self.settings.model_path, make_pool(pool.name, pool.role, pool.engine.args))

    def backend(self, api_key: str) -> Backend:
        """SGLang's native backend with the run's key and the model directory as the tokenizer."""
        return SGLangBackend(api_key, self.cfg.tokenizer or self.settings.model_path)

    def log_dir(self, run_dir: Path) -> str | None:
        """RUN_DIR/logs on a local Ray (SGLang's logs are what a failed start is read from)."""
        return str(run_dir.resolve() / "logs") if not self.cfg.address else None

    def reported(self, info: dict) -> Reported:
        """What an SGLang server runs: no checkpoint interval nor strategy where it uses no mamba radix cache."""
        r = reported_settings(info)
        interval = track_interval(info)
        return dataclasses.replace(r, interval=interval, strategy=r.strategy if interval is not None else None)
