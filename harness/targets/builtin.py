"""The built-in engine (`engine.serve`) under Ray: the default target, and the one whose oracle is exact.

One candidate pool per --intervals value runs DFlash (block --block-size) with the
radix cache's extra_buffer checkpoints every I tokens; --diagnose adds a
speculation-only (`i<I>-spec`) and a cache-only (`i<I>-cache`) pool per interval;
--cover gives the candidates the scripted drafter; --candidate-args are engine.serve
flags (harness/engine_args.py). The reference runs the cold path. Each pool's
replicas run `python -m engine.serve` (or --server-command) with the flags below,
their rank actors built from the same EngineConfig; the workload is built for the
flags' intervals and B in the byte tokenizer.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.server.config import to_argv
from harness.backends import Backend, make_backend
from harness.calibrate import calibrating
from harness.engine_args import EngineArgsError, check_config, engine_overrides
from harness.errors import ConfigError
from harness.plan import REFERENCE_POOL, EngineSpec, Plan, PoolPlan, sessions_for, skipped
from harness.targets.base import Need
from harness.targets.managed import Launch, ManagedTarget
from harness.workload import WorkloadTarget, from_flags
from reports.controls import CONTROL_PREFIX
from reports.gate import GateThresholds

if TYPE_CHECKING:
    from harness.config import RunConfig

DEFAULT_SERVER_COMMAND = ("python", "-m", "engine.serve")  # a leading python is the replica's interpreter
# --diagnose pools beside the full candidate `i<I>`: name suffix -> (speculative, radix cache)
DIAGNOSE_VARIANTS = {"spec": (True, False), "cache": (False, True)}


def candidate_engine(cfg: RunConfig, interval: int, speculative: bool = True, radix_cache: bool = True) -> EngineSpec:
    """A candidate pool: DFlash with the radix cache's extra_buffer checkpoints every `interval` tokens
    (or, for --diagnose, one of the two without the other)."""
    return EngineSpec(interval, cfg.block_size if speculative else None, "extra_buffer" if radix_cache else None,
                      cfg.tp_size, cfg.inject_fault, speculative, radix_cache,
                      dtype_args(cfg) + cfg.candidate_engine_args)


def dtype_args(cfg: RunConfig) -> tuple[str, ...]:
    """`--dtype D` for every pool when --dtype is not the fp32 default (so fp32 command lines and records stay as
    they were); it lands in each record's `engine.args`."""
    return ("--dtype", cfg.dtype) if cfg.dtype != "float32" else ()


def reference_engine(cfg: RunConfig) -> EngineSpec:
    """The cold path: no speculation, no radix cache, never a fault (it is the oracle); the run's dtype."""
    return EngineSpec(None, None, None, cfg.tp_size, None, False, False, dtype_args(cfg))


def _base_config(cfg: RunConfig, engine: EngineSpec) -> dict:
    kw: dict = {"model_path": cfg.model_path, "tp_size": cfg.tp_size}
    if cfg.model_preset:
        kw["model_preset"] = cfg.model_preset
    if cfg.page_size:
        kw["page_size"] = cfg.page_size
    # without a radix cache the interval is unused, but must still satisfy the engine's page check
    kw["mamba_track_interval"] = engine.interval or cfg.intervals[0]
    if engine.speculative:
        kw.update(speculative_algorithm="DFLASH", speculative_num_draft_tokens=engine.block_size)
    else:
        kw["speculative_algorithm"] = "NONE"
    if engine.radix_cache:
        kw["mamba_radix_cache_strategy"] = engine.strategy
    else:
        kw["disable_radix_cache"] = True
    if engine.fault:
        kw["inject_fault"] = engine.fault
    return kw


def engine_config(cfg: RunConfig, engine: EngineSpec) -> EngineConfig:
    """The built-in engine's settings for a pool's replicas (what their ranks and servers are built from)."""
    return EngineConfig(**{**_base_config(cfg, engine), **engine_overrides(engine.args)})


def check_candidate_engines(cfg: RunConfig) -> None:
    """Raise EngineArgsError (naming the flag) if a candidate pool's EngineConfig would be invalid."""
    for interval in cfg.intervals:
        for speculative, radix in ((True, True), *DIAGNOSE_VARIANTS.values()):
            engine = candidate_engine(cfg, interval, speculative, radix)
            check_config(_base_config(cfg, engine), engine_overrides(engine.args))


# flags every replica command spells out, default or not, so a record's server line says what ran
ROLE_FLAGS = ("model_path", "tp_size", "speculative_algorithm", "mamba_track_interval")


def server_args(cfg: RunConfig, engine: EngineSpec) -> list[str]:
    """`engine.serve` flags for a pool (host and port are added per replica). Never the API key: a command line
    is readable by every local user; replicas get it in their environment (harness/replica.py)."""
    return to_argv(engine_config(cfg, engine), always=ROLE_FLAGS)


def server_command(cfg: RunConfig, engine: EngineSpec) -> str:
    """The command line a pool's replicas run, as `--dry-run` shows it."""
    return shlex.join([*(cfg.server_command or DEFAULT_SERVER_COMMAND), *server_args(cfg, engine),
                       "--host", "HOST", "--port", "PORT"])




def control_engine(cfg: RunConfig, interval: int, speculative: bool, radix_cache: bool) -> EngineSpec:
    """A calibration control: a candidate's code path (speculation only, or cache only) clean: never a fault,
    never --candidate-args or --cover (a control measures the path's numerics, not the candidate's flags)."""
    return EngineSpec(interval, cfg.block_size if speculative else None, "extra_buffer" if radix_cache else None,
                      cfg.tp_size, None, speculative, radix_cache, dtype_args(cfg))


def builtin_plan(cfg: RunConfig, sessions: list) -> Plan:
    """Pools of built-in replicas: one candidate pool per interval (with --diagnose also `i<I>-spec` and
    `i<I>-cache`), when calibrating from this run the clean controls `ctl-i<I>-spec` and `ctl-i<I>-cache`
    (harness/calibrate.py), and one reference pool."""
    cands = []
    controls = calibrating(cfg) and not cfg.baseline_run
    for i in cfg.intervals:
        variants = {"": (True, True), **(DIAGNOSE_VARIANTS if cfg.diagnose else {})}
        for suffix, (speculative, radix) in variants.items():
            engine = candidate_engine(cfg, i, speculative, radix)
            name = f"i{i}" + (f"-{suffix}" if suffix else "")
            cands.append(PoolPlan(name, "candidate", engine, cfg.replicas, sessions_for(sessions, i)))
        for suffix, (speculative, radix) in (DIAGNOSE_VARIANTS if controls else {}).items():
            cands.append(PoolPlan(f"{CONTROL_PREFIX}i{i}-{suffix}", "candidate",
                                  control_engine(cfg, i, speculative, radix), cfg.replicas, sessions_for(sessions, i)))
    cands = tuple(cands)
    ref = PoolPlan(REFERENCE_POOL, "reference", reference_engine(cfg), cfg.reference_replicas)
    return Plan(cands, ref, cfg.concurrency, skipped(sessions, set(cfg.intervals)))


class BuiltinTarget(ManagedTarget):
    """The built-in engine: pools from the flags, servers that report exactly what they were started with."""

    key = "builtin"
    controls = frozenset({"calibrate", "candidate_args", "diagnose", "cover"})
    drift_tolerance = GateThresholds().drift_tolerance  # fp32 and deterministic: numerics are bit-identical

    @classmethod
    def validate(cls, cfg: RunConfig, need: Need) -> None:
        """The SGLang backend, and candidate flags the engine accepts: --candidate-args, --cover (which runs its
        own suite) and the EngineConfig every candidate pool would be built with."""
        need(cfg.backend == "sglang", f"--backend {cfg.backend} drives already-running servers: give "
             "--endpoint and --reference-endpoint (built-in replicas speak sglang)")
        need(not cfg.cover or cfg.suite == "frozen", f"--cover runs its own suite (cover); drop --suite {cfg.suite}")
        try:
            overrides = engine_overrides(cfg.candidate_args)
        except EngineArgsError as e:
            raise ConfigError(f"--candidate-args: {e}") from None
        need(not (cfg.cover and {"drafter_mode", "scripted_accept"} & set(overrides)),
             "--candidate-args: --cover sets --drafter-mode scripted --scripted-accept -1 itself")
        # The engine needs a working and two tracking slots per running request: fewer can never admit one.
        slots = overrides.get("max_state_slots", 0)
        need(not 0 < slots < 3, f"--candidate-args: --max-state-slots {slots} cannot hold one request (a working "
             "and two tracking slots); use >= 3 (or 0 for the default)")
        if overrides or cfg.cover:
            try:
                check_candidate_engines(cfg)
            except EngineArgsError as e:
                raise ConfigError(f"--candidate-args: {e}") from None

    def workload(self, infos: dict[str, dict]) -> WorkloadTarget:
        """The flags' intervals and B, in the byte tokenizer the engine runs."""
        cfg = self.cfg
        target = from_flags(cfg, cfg.tokenizer or "byte", "--tokenizer" if cfg.tokenizer else "the built-in engine")
        if target.tokenizer is not None and target.tokenizer.name != "byte":
            raise ConfigError(f"--tokenizer {cfg.tokenizer}: built-in replicas run the byte tokenizer; --tokenizer "
                              "is for --endpoint servers")
        return target

    def plan(self, sessions: list, infos: dict[str, dict]) -> Plan:
        return builtin_plan(self.cfg, sessions)

    def describe(self, plan: Plan) -> str:
        return plan.describe(self.cfg, lambda engine: server_command(self.cfg, engine))

    def launch(self, pool: PoolPlan) -> Launch:
        """engine.serve (or --server-command) with the pool's flags, in the project's environment."""
        return Launch(self.cfg.server_command, tuple(server_args(self.cfg, pool.engine)),
                      asdict(engine_config(self.cfg, pool.engine)))

    def backend(self, api_key: str) -> Backend:
        return make_backend("sglang", api_key)
