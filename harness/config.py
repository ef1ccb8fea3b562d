"""RunConfig: the run-wide settings of a harness run (workload, sweep, cluster, gate, run directory), validated
here, and the chosen target's own settings, a TargetSettings subclass declared by each kind of target
(harness/targets/); the command line is harness/cli.py.

Each field is declared once with `setting` (harness/settings.py): its kind, help and
what a resume does with it; every flag `--foo-bar` has the TOML key `foo_bar`. The
target's settings (`RunConfig.target`) come from the target's module: this module
knows only what every target says of itself (harness/settings.py TargetSettings).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from harness.backends import BACKENDS
from harness.errors import ConfigError
from harness.placement import DEVICES
from harness.settings import Need, check_choices, declared, default_of, flag, setting
from reports.gate import EXTERNAL_DRIFT_TOLERANCE, GateThresholds
from reports.latency import parse_slo

__all__ = ["ConfigError", "RunConfig", "TargetSettings", "flag", "validate"]
PLACEMENTS = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")
ARRIVALS = ("constant", "poisson")  # --arrival: how open-loop (--request-rate) send times are spaced

GATE = GateThresholds()  # the gate's defaults, defined once in reports/gate.py


@dataclass(frozen=True)
class TargetSettings:
    """One kind of target's own settings, and what the rest of a run needs to know about that target.

    A subclass sets `key` (its --engine value, or the name of a target chosen otherwise) and declares its fields
    with `setting`; the run reads only the attributes below, never the target's name.
    """

    key: ClassVar[str] = ""
    managed: ClassVar[bool] = True  # the harness starts its servers (under Ray); else they run already
    chosen_by: ClassVar[tuple[str, ...]] = ()  # its settings that choose it without --engine (else --engine KEY)
    default_backend: ClassVar[str] = "sglang"  # --backend when not given
    refuses: ClassVar[frozenset[str]] = frozenset()  # run-wide settings (RunConfig's) it cannot honour

    @property
    def noisy(self) -> bool:
        """Whether its numerics move with the code path (bf16, GPU kernels): then every run is calibrated from
        controls (harness/calibrate.py); an exact target keeps its fixed tolerance."""
        return True

    @property
    def drift_tolerance(self) -> float:
        """The gate's default --drift-tolerance for this target."""
        return EXTERNAL_DRIFT_TOLERANCE

    def suite(self, suite: str) -> str:
        """The suite a run drives, given --suite (a target may run one of its own)."""
        return suite

    def suite_flag(self, suite: str) -> str:
        """The flag that chose the workload, for messages."""
        return f"--suite {suite}"

    def validate(self, run: RunConfig, need: Need) -> None:
        """The target's own settings, checked against the run's; `need(ok, message)` raises the ConfigError."""
        check_choices(self, need)

    def refused(self, name: str, offered_by: tuple[str, ...]) -> str:
        """Why the setting `name`, which this target does not have, is refused; `offered_by`: the --engine values
        whose targets have it."""
        where = f" (--engine {' or '.join(offered_by)} does)" if offered_by else ""
        return f"{flag(name)} does not apply to this target{where}"

    def to_json(self) -> dict:
        """The settings as JSON-ready values (config.json's run_config holds them beside the run-wide ones)."""
        return asdict(self)


@dataclass(frozen=True)
class RunConfig:
    """One harness run: workload, sweep, cluster, run directory and gate thresholds, and `target`: the settings of
    the kind of target it gates (which kind is the settings' `key`)."""

    target: TargetSettings  # the chosen target's own settings (harness/targets/<key>.py)

    calibrate: bool = setting(False, "bool", "calibrate the thresholds per code path from clean control pools "
                              "(docs/reports.md); automatic for noisy targets (--dtype bfloat16, vllm), an option "
                              "for the fp32 built-in engine and sglang; the report shows the calibration",
                              resume="fixed")
    baseline_run: str | None = setting(None, "str", "a trusted run directory (e.g. the last release's) whose records "
                                       "calibrate the tolerances, path by path, and whose turns each restored turn "
                                       "of the same request is compared with (the paired check)", resume="fixed")
    deterministic: bool = setting(False, "bool", "ask every pool for its target's deterministic mode (refused where a "
                                  "server reports running without it); exact paths gated exactly", resume="fixed")
    min_coverage: float = setting(GATE.min_coverage, "float", "gate: the share of boundary cells a run must cross "
                                  "and restore; below it the verdict is INCONCLUSIVE")
    suite: str = setting("frozen", "str", "workload: frozen, load, or a JSONL file (workloads/README.md)",
                         resume="fixed")
    num_requests: int | None = setting(None, "int", "requests of the load suite", resume="fixed")
    seed: int = setting(0, "int", "seed of the generated suites: the load profile, and where the frozen suite's "
                        "text starts (0 with I=128/256, B=8 and the byte tokenizer: the committed frozen suite)",
                        resume="fixed")
    intervals: tuple[int, ...] = setting((128, 256), "ints", "mamba track intervals; one candidate pool each",
                                         resume="fixed")
    concurrency: tuple[int, ...] = setting((1, 4, 8, 16), "ints", "sweep points: requests in flight per pool",
                                           resume="fixed")
    request_rate: tuple[float, ...] = setting((), "floats", "open-loop sweep points: requests per second per pool, "
                                              "beside the --concurrency points", resume="fixed")
    arrival: str = setting("constant", "str", "open-loop send times (--request-rate): constant spacing, or "
                           "poisson (exponential gaps, seeded by --seed)", resume="fixed", choices=ARRIVALS)
    warmup: int = setting(0, "int", "requests per sweep point that are sent and recorded as warmup, not gated",
                          resume="fixed")
    duration: float | None = setting(None, "float", "seconds a sweep point may send for; what is left is skipped "
                                     "and reported", resume="fixed")
    max_error_rate: float | None = setting(None, "float", "stop a sweep point early once this fraction of its "
                                           "answered requests failed (reported)")
    slo: str | None = setting(None, "str", "latency objectives, e.g. 'ttft_ms=500,tpot_ms=50': SLO attainment and "
                              "goodput per sweep point")
    replicas: int = setting(1, "int", "replicas per candidate pool")
    reference_replicas: int = setting(1, "int", "replicas of the reference (cold-path) pool")
    tp_size: int = setting(1, "int", "tensor-parallel ranks per replica (each on a GPU of its own on --device "
                           "cuda)", resume="fixed")
    device: str = setting("auto", "str", "where every pool's replicas compute: cuda (their own GPUs, reserved "
                          "through their placement groups), cpu, or auto (cuda on a Ray cluster with GPUs, else cpu)",
                          resume="fixed", choices=DEVICES)
    gpus_per_rank: float | None = setting(None, "float", "GPUs each tensor-parallel rank reserves (default: 1 on "
                                          "GPUs, 0 on CPU); a fraction lets built-in replicas of one rank share a "
                                          "GPU")
    block_size: int = setting(8, "int", "DFlash block size B (--speculative-num-draft-tokens)", resume="fixed")
    address: str | None = setting(None, "str", "the Ray cluster to join: auto (the one this node runs, e.g. on a "
                                  "`ray up` head node) or HOST:PORT; else RAY_ADDRESS; else a local Ray of the "
                                  "harness's own")
    num_cpus: int | None = setting(None, "int", "logical CPUs of a local Ray (default: enough for every replica, "
                                   "at least the machine's cores)")
    placement: str = setting("STRICT_PACK", "str", "placement-group strategy of a replica's bundles (one per TP "
                             "rank)", choices=PLACEMENTS)
    runs_dir: str = setting("runs", "str", "where run directories go")
    run_id: str | None = setting(None, "str", "name of the run directory (default: UTC time + random suffix)")
    resume: str | None = setting(None, "str", "finish the interrupted run in RUN_DIR")
    backend: str = setting("sglang", "str", "protocol of the --endpoint servers: sglang (native /generate, as the "
                           "built-in engine) or openai (/v1/completions: vLLM and other OpenAI-compatible servers)",
                           resume="fixed", choices=BACKENDS)
    tokenizer: str | None = setting(None, "str", "the target's tokenizer: a tokenizer.json or a local model "
                                    "directory (default: the server's tokenizer_path when readable); nothing is "
                                    "downloaded", resume="runs")
    api_key: str | None = setting(None, "str", "sent as 'Authorization: Bearer KEY' (and given to built-in "
                                  "replicas)")
    request_timeout: float = setting(600.0, "float", "seconds per request")
    startup_timeout: float = setting(600.0, "float", "seconds for a replica to become healthy at the start of a "
                                     "run")
    recover_timeout: float = setting(60.0, "float", "seconds a failed replica has to serve again (Ray restarts "
                                     "it) before it is given up: its in-flight requests are re-sent meanwhile")
    max_replica_restarts: int = setting(3, "int", "restarts of one built-in replica whose server died; one that "
                                        "keeps dying is given up (a candidate's requests then fail: a finding; "
                                        "the reference's: the harness fails)")
    max_retries: int = setting(3, "int", "re-sends of a request after replica failures")
    reference_concurrency: int = setting(8, "int", "reference requests in flight")
    reference_nice: int = setting(10, "int", "niceness (0-19) added to the reference replicas' servers (under Ray): "
                                  "references are off the critical path, so where they share cores with "
                                  "candidates they yield the CPU to them and catch up when the candidates idle; "
                                  "0: no change")
    drivers: int | None = setting(None, "int", "Ray actors that send the sessions (docs/harness.md); default: auto")
    sequential_pools: bool = setting(False, "bool", "run the interval pools one after another (default: together)")
    analyze_on_cluster: bool = setting(False, "bool", "analyze with Ray tasks on the run's cluster (docs/reports.md)")
    no_restore_window: bool = setting(False, "bool", "send no restore-window probe: by default each turn that "
                                      "restored a checkpoint is sent again to its replica and to the reference "
                                      "scoring its prompt tokens past the checkpoint, where a wrong restored "
                                      "state shows first (SGLang protocol only; docs/reports.md)", resume="fixed")
    margin_threshold: float = setting(GATE.margin_threshold, "float", "gate: top-1/top-2 log-prob margin below "
                                      "which a flip is soft")
    max_soft_rate: float = setting(GATE.max_soft_rate, "float", "gate: largest allowed fraction of soft flips")
    max_hard: int = setting(GATE.max_hard, "int", "gate: largest allowed number of hard mismatches")
    max_errors: int = setting(GATE.max_errors, "int", "gate: largest allowed number of failed requests")
    max_drift: int = setting(GATE.max_drift, "int", "gate: largest allowed number of requests with log-prob drift "
                             "(same tokens, log-probs off by more than the tolerance)")
    drift_tolerance: float | None = setting(
        None, "float", f"gate: largest |candidate - reference| log-prob that counts as numerics (default "
        f"{GATE.drift_tolerance:g} for built-in replicas, {EXTERNAL_DRIFT_TOLERANCE:g} for --endpoint engines)")
    dry_run: bool = setting(False, "bool", "print the plan (with each pool's server command) and exit")
    trust_run_config: bool = setting(False, "bool", "with --resume: use what RUN_DIR/config.json says to run "
                                     "(engine, interpreters, server command and flags, model, tokenizer) and its "
                                     "--address, each shown first; without it a resume takes them from this "
                                     "command line only")
    no_progress: bool = setting(False, "bool", "no live progress bar")

    def __post_init__(self) -> None:
        validate(self)

    @property
    def key(self) -> str:
        """The kind of target the run gates (its settings' key: builtin, vllm, sglang, endpoints, ...)."""
        return self.target.key

    @property
    def engine(self) -> str | None:
        """The --engine value that chooses this run's target (None: its own settings choose it, as --endpoint)."""
        return None if self.target.chosen_by else self.key

    @property
    def external(self) -> bool:
        """True when driving already-running servers instead of starting replicas."""
        return not self.target.managed

    @property
    def gate(self) -> GateThresholds:
        """The gate's thresholds for this run (the drift tolerance resolved per target)."""
        tolerance = self.target.drift_tolerance if self.drift_tolerance is None else self.drift_tolerance
        return GateThresholds(max_hard=self.max_hard, max_errors=self.max_errors, max_soft_rate=self.max_soft_rate,
                              margin_threshold=self.margin_threshold, max_drift=self.max_drift,
                              drift_tolerance=tolerance)

    @property
    def workload(self) -> str:
        """The suite the run drives: --suite, unless the target runs one of its own (the built-in --cover)."""
        return self.target.suite(self.suite)

    def settings(self) -> dict:
        """Every setting by name, run-wide and the target's, as one flat mapping (the API key in clear)."""
        run = {name: getattr(self, name) for name in declared(RunConfig)}
        own = {name: getattr(self.target, name) for name in declared(type(self.target))}
        return {**run, **own}

    def to_json(self) -> dict:
        """The config as JSON-ready values, flat as the flags are, with `target` (its kind) and, for a target chosen
        by --engine, `engine`; the API key redacted."""
        d = {**asdict(self), **self.target.to_json()}
        d["target"] = self.key
        if self.engine is not None:
            d["engine"] = self.engine
        if d["api_key"]:
            d["api_key"] = "***"
        return d


def kind_of(name: str) -> str:
    """How the run-wide setting `name` is parsed (harness/settings.py KINDS)."""
    return declared(RunConfig)[name].metadata["kind"]


def validate(c: RunConfig) -> None:
    """Raise ConfigError on the first bad or inconsistent setting, naming its flag; then the target's own."""
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    need(isinstance(c.target, TargetSettings), f"RunConfig.target must be a target's settings, got {c.target!r}")
    need(bool(c.suite), "--suite must not be empty")
    need(c.num_requests is None or c.num_requests >= 1, f"--num-requests must be >= 1, got {c.num_requests}")
    need(c.seed >= 0, f"--seed must be >= 0, got {c.seed}")
    for name in ("intervals", "concurrency"):
        vals = getattr(c, name)
        need(len(vals) > 0, f"{flag(name)} needs at least one value")
        need(all(v >= 1 for v in vals), f"{flag(name)} values must be >= 1, got {list(vals)}")
        need(len(set(vals)) == len(vals), f"{flag(name)} has repeated values: {list(vals)}")
    for name in ("replicas", "reference_replicas", "tp_size", "block_size", "reference_concurrency"):
        need(getattr(c, name) >= 1, f"{flag(name)} must be >= 1, got {getattr(c, name)}")
    for name in ("max_retries", "max_hard", "max_errors", "max_replica_restarts", "max_drift"):
        need(getattr(c, name) >= 0, f"{flag(name)} must be >= 0, got {getattr(c, name)}")
    need(c.num_cpus is None or c.num_cpus >= 1, f"--num-cpus must be >= 1, got {c.num_cpus}")
    g = c.gpus_per_rank
    if g is not None:
        need(g >= 0 and (g <= 1 or g == int(g)), f"--gpus-per-rank must be >= 0, and a fraction below 1 (Ray "
             f"shares one GPU, never several), got {g:g}")
        need(not (c.device == "cpu" and g), f"--gpus-per-rank {g:g}: --device cpu reserves no GPU")
        need(not (c.device == "cuda" and g == 0), "--gpus-per-rank 0: --device cuda needs GPUs per rank")
    need(0 <= c.reference_nice <= 19, f"--reference-nice must be in 0..19, got {c.reference_nice}")
    need(c.request_timeout > 0 and c.startup_timeout > 0 and c.recover_timeout > 0,
         "--request-timeout, --startup-timeout and --recover-timeout must be > 0")
    need(not c.trust_run_config or c.resume is not None, "--trust-run-config applies to --resume only")
    need(c.margin_threshold >= 0, f"--margin-threshold must be >= 0, got {c.margin_threshold}")
    need(0 <= c.max_soft_rate <= 1, f"--max-soft-rate must be in [0, 1], got {c.max_soft_rate}")
    need(c.drift_tolerance is None or c.drift_tolerance >= 0,
         f"--drift-tolerance must be >= 0, got {c.drift_tolerance}")
    check_choices(c, need)
    need(all(r > 0 for r in c.request_rate), f"--request-rate values must be > 0, got {list(c.request_rate)}")
    need(len(set(c.request_rate)) == len(c.request_rate), f"--request-rate has repeated values: {list(c.request_rate)}")
    need(c.warmup >= 0, f"--warmup must be >= 0, got {c.warmup}")
    need(c.duration is None or c.duration > 0, f"--duration must be > 0, got {c.duration}")
    need(c.max_error_rate is None or 0 <= c.max_error_rate <= 1,
         f"--max-error-rate must be in [0, 1], got {c.max_error_rate}")
    try:
        parse_slo(c.slo)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    need(0 <= c.min_coverage <= 1, f"--min-coverage must be in [0, 1], got {c.min_coverage}")
    if c.baseline_run is not None:  # checked before any replica starts: the calibration reads it at the end
        records = Path(c.baseline_run) / "records"
        need(records.is_dir() and any(records.iterdir()),
             f"--baseline-run: {c.baseline_run!r} is not a run directory with records (no files in {records})")
    path = c.tokenizer
    need(path is None or bool(path) and (not path.startswith((".", "/", "~")) and not path.endswith(".json")
                                         or Path(path).expanduser().exists()),
         f"--tokenizer {path}: no such file or directory (give a tokenizer.json or a local model directory)")
    for name in type(c.target).refuses:
        value = getattr(c, name)
        need(not value or value == default_of(declared(RunConfig)[name]), c.target.refused(name, ()))
    c.target.validate(c, need)
    need(c.run_id is None or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", c.run_id) is not None
         and c.run_id != "latest", f"--run-id must be letters, digits, '.', '_' or '-', got {c.run_id!r}")
