"""The built-in engine (`engine.serve`) under Ray: the default target, and the one whose oracle is exact.

One candidate pool per --intervals value runs DFlash (block --block-size) with the
radix cache's extra_buffer checkpoints every I tokens; --diagnose adds a
speculation-only (`i<I>-spec`) and a cache-only (`i<I>-cache`) pool per interval;
--cover gives the candidates the scripted drafter; --candidate-args are engine.serve
flags (harness/engine_args.py). The reference runs the cold path. Each pool's
replicas run `python -m engine.serve` (or --server-command) with the flags below,
their rank actors built from the same EngineConfig; the workload is built for the
flags' intervals and B in the byte tokenizer. Every pool and every rank computes on
the run's device (`--device`): on CUDA each rank holds a GPU of its own (one bundle
per rank); a fraction of a GPU per rank lets replicas of one rank share one.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.config import EngineConfig
from engine.faults import FAULTS
from engine.server.config import to_argv
from harness.backends import Backend, make_backend
from harness.calibrate import calibrating
from harness.engine_args import COVER_ARGS, EngineArgsError, check_config, engine_overrides
from harness.errors import ConfigError
from harness.plan import REFERENCE_POOL, EngineSpec, Plan, PoolPlan, sessions_for, skipped
from harness.settings import Need, setting
from harness.targets.base import other_server
from harness.targets.managed import Devices, Launch, ManagedSettings, ManagedTarget, diagnose_setting
from harness.workload import WorkloadTarget, from_flags
from reports.controls import CONTROL_PREFIX
from reports.gate import GateThresholds

if TYPE_CHECKING:
    from harness.config import RunConfig

DTYPES = ("float32", "bfloat16")  # --dtype of the built-in engine's pools
DEFAULT_SERVER_COMMAND = ("python", "-m", "engine.serve")  # a leading python is the replica's interpreter
# --diagnose pools beside the full candidate `i<I>`: name suffix -> (speculative, radix cache)
DIAGNOSE_VARIANTS = {"spec": (True, False), "cache": (False, True)}


@dataclass(frozen=True)
class BuiltinSettings(ManagedSettings):
    """The built-in engine's own settings (engine.serve's flags the harness sets per pool)."""

    key = "builtin"
    gpu_fractions = True  # small replicas of one rank may share a GPU

    model_preset: str | None = setting(None, "str", "architecture for --model-path random (tiny, small)",
                                       resume="fixed")
    dtype: str = setting("float32", "str", "built-in engine: the dtype of every pool (engine.serve --dtype): "
                         "float32, the exact target, or bfloat16, a noisy one as GPU engines serve", resume="fixed",
                         choices=DTYPES)
    page_size: int | None = setting(None, "int", "KV page size of the replicas (engine default if unset)",
                                    resume="fixed")
    inject_fault: str | None = setting(None, "str", "a named fault (engine/faults.py) for the candidate pools; "
                                       f"the reference stays the clean oracle: {', '.join(FAULTS)}", resume="fixed")
    diagnose: bool = diagnose_setting()
    cover: bool = setting(False, "bool", "built-in engine: run the cover suite with the scripted drafter, so "
                          "every (verify step, commit length) boundary cell is crossed and restored per interval",
                          resume="fixed")

    @property
    def noisy(self) -> bool:
        """fp32 is exact (bit-identical numerics on every path); any other dtype is calibrated."""
        return self.dtype != "float32"

    @property
    def drift_tolerance(self) -> float:
        return GateThresholds().drift_tolerance

    def suite(self, suite: str) -> str:
        return "cover" if self.cover else suite

    def suite_flag(self, suite: str) -> str:
        return "--cover" if self.cover else f"--suite {suite}"

    @property
    def candidate_engine_args(self) -> tuple[str, ...]:
        """Engine flags of the candidate replicas: --cover's scripted drafter, then --candidate-args."""
        return (COVER_ARGS if self.cover else ()) + self.candidate_args

    def validate(self, run: RunConfig, need: Need) -> None:
        """Pages, model, fault, the SGLang backend, and candidate flags the engine accepts: --candidate-args,
        --cover (which runs its own suite) and the EngineConfig every candidate pool would be built with."""
        super().validate(run, need)
        need(self.page_size is None or self.page_size >= 1, f"--page-size must be >= 1, got {self.page_size}")
        for i in run.intervals:
            need(self.page_size is None or i % self.page_size == 0,
                 f"--intervals: interval {i} is not a multiple of --page-size {self.page_size}")
        need(self.model_preset is None or self.model_path == "random",
             f"--model-preset applies to --model-path random only (model path is {self.model_path!r})")
        weights = Path(self.model_path).expanduser()
        need(self.model_path in ("default", "random") or run.address is not None or weights.is_dir(),
             f"--model-path {self.model_path}: not 'default', 'random' or a weights directory (one with "
             "config.json and model.safetensors, as `python -m training` writes)")
        if self.inject_fault is not None:
            from engine.faults import check_fault_name

            try:
                check_fault_name(self.inject_fault)
            except ValueError as e:
                need(False, f"--inject-fault: {e}")
        need(run.backend == "sglang", f"--backend {run.backend} drives already-running servers: give "
             "--endpoint and --reference-endpoint (built-in replicas speak sglang)")
        need(not self.cover or run.suite == "frozen", f"--cover runs its own suite (cover); drop --suite {run.suite}")
        try:
            overrides = engine_overrides(self.candidate_args)
        except EngineArgsError as e:
            raise ConfigError(f"--candidate-args: {e}") from None
        need(not (self.cover and {"drafter_mode", "scripted_accept"} & set(overrides)),
             "--candidate-args: --cover sets --drafter-mode scripted --scripted-accept -1 itself")
        # The engine needs a working and two tracking slots per running request: fewer can never admit one.
        slots = overrides.get("max_state_slots", 0)
        need(not 0 < slots < 3, f"--candidate-args: --max-state-slots {slots} cannot hold one request (a working "
             "and two tracking slots); use >= 3 (or 0 for the default)")
        try:  # every pool's EngineConfig, as its replicas will build it: a bad value stops here, not in Ray
            check_candidate_engines(run)
        except EngineArgsError as e:
            raise ConfigError(engine_error(str(e), bool(overrides))) from None


def candidate_engine(cfg: RunConfig, interval: int, speculative: bool = True, radix_cache: bool = True) -> EngineSpec:
    """A candidate pool: DFlash with the radix cache's extra_buffer checkpoints every `interval` tokens
    (or, for --diagnose, one of the two without the other)."""
    return EngineSpec(interval, cfg.block_size if speculative else None, "extra_buffer" if radix_cache else None,
                      cfg.tp_size, cfg.target.inject_fault, speculative, radix_cache,
                      dtype_args(cfg) + cfg.target.candidate_engine_args)


def dtype_args(cfg: RunConfig) -> tuple[str, ...]:
    """`--dtype D` for every pool when --dtype is not the fp32 default (so fp32 command lines and records stay as
    they were), and --deterministic's `--enable-deterministic-inference`; they land in each record's
    `engine.args`."""
    dtype = ("--dtype", cfg.target.dtype) if cfg.target.dtype != "float32" else ()
    return dtype + (("--enable-deterministic-inference",) if cfg.deterministic else ())


def reference_engine(cfg: RunConfig) -> EngineSpec:
    """The cold path: no speculation, no radix cache, never a fault (it is the oracle); the run's dtype."""
    return EngineSpec(None, None, None, cfg.tp_size, None, False, False, dtype_args(cfg))


def _base_config(cfg: RunConfig, engine: EngineSpec, device: str = "cpu") -> dict:
    kw: dict = {"model_path": cfg.target.model_path, "tp_size": cfg.tp_size}
    if device != "cpu":  # the engine's default: CPU command lines stay as they were
        kw["device"] = device
    if cfg.target.model_preset:
        kw["model_preset"] = cfg.target.model_preset
    if cfg.target.page_size:
        kw["page_size"] = cfg.target.page_size
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


def engine_config(cfg: RunConfig, engine: EngineSpec, device: str = "cpu") -> EngineConfig:
    """The built-in engine's settings for a pool's replicas on `device` (what their ranks and servers are built
    from)."""
    return EngineConfig(**{**_base_config(cfg, engine, device), **engine_overrides(engine.args)})


# EngineConfig fields the harness sets from its own flags: how a config error names them to the user
HARNESS_FLAGS = {"mamba_track_interval": "--intervals", "speculative_num_draft_tokens": "--block-size",
                 "page_size": "--page-size", "tp_size": "--tp-size", "model_preset": "--model-preset",
                 "model_path": "--model-path", "dtype": "--dtype"}


def engine_error(message: str, candidate_args: bool) -> str:
    """An EngineConfig error in the harness's words: the flags it came from (an engine flag of --candidate-args is
    already spelled as one)."""
    if candidate_args and "--" in message:
        return f"--candidate-args: {message}"
    for name, flag in HARNESS_FLAGS.items():
        message = message.replace(name, flag)
    return message


def check_candidate_engines(cfg: RunConfig) -> None:
    """Raise EngineArgsError (naming the flag) if a candidate pool's EngineConfig would be invalid."""
    for interval in cfg.intervals:
        for speculative, radix in ((True, True), *DIAGNOSE_VARIANTS.values()):
            engine = candidate_engine(cfg, interval, speculative, radix)
            check_config(_base_config(cfg, engine), engine_overrides(engine.args))


# flags every replica command spells out, default or not, so a record's server line says what ran
ROLE_FLAGS = ("model_path", "tp_size", "speculative_algorithm", "mamba_track_interval")


def server_args(cfg: RunConfig, engine: EngineSpec, device: str = "cpu") -> list[str]:
    """`engine.serve` flags for a pool on `device` (host and port are added per replica). Never the API key: a
    command line is readable by every local user; replicas get it in their environment (harness/replica.py)."""
    return to_argv(engine_config(cfg, engine, device), always=ROLE_FLAGS)


def server_command(cfg: RunConfig, engine: EngineSpec, device: str = "cpu") -> str:
    """The command line a pool's replicas run on `device`, as `--dry-run` shows it."""
    return shlex.join([*(cfg.target.server_command or DEFAULT_SERVER_COMMAND), *server_args(cfg, engine, device),
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
        variants = {"": (True, True), **(DIAGNOSE_VARIANTS if cfg.target.diagnose else {})}
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

    settings_class = BuiltinSettings
    own_ranks = False  # one Ray rank actor per TP rank, each in a bundle of its own

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
        variants = self.dry_run_devices()

        def lines(engine: EngineSpec) -> list[str]:
            return [f"server{' on GPUs' if d.on_gpu else ' on CPU' if len(variants) > 1 else ''}: "
                    + server_command(self.cfg, engine, d.kind) for d in variants]

        return plan.describe(self.cfg, lines, self.placement_text())

    def launch(self, pool: PoolPlan, devices: Devices) -> Launch:
        """engine.serve (or --server-command) with the pool's flags on the run's device, in the project's
        environment."""
        return Launch(self.cfg.target.server_command, tuple(server_args(self.cfg, pool.engine, devices.kind)),
                      asdict(engine_config(self.cfg, pool.engine, devices.kind)))

    def check_reported(self, pool, url: str, info: dict) -> str | None:
        """The checks every target has, then: the server reports the settings that make it this pool's (speculation,
        radix cache, fault, interval, dtype, TP) as its replicas were started with them, so that another server
        answering on the address (a neighbour handed the same port) is named, not driven as this pool's."""
        problem = super().check_reported(pool, url, info)
        if problem:
            return problem
        return other_server(pool.name, url, info, asdict(engine_config(self.cfg, pool.engine)))

    def node_paths(self, pool: PoolPlan) -> tuple[tuple[str, str], ...]:
        """A weights directory given as --model-path (default and random need none)."""
        path = self.cfg.target.model_path
        return () if path in ("default", "random") else ((path, "--model-path"),)

    def backend(self, api_key: str) -> Backend:
        return make_backend("sglang", api_key)
