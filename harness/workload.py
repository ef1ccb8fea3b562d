"""The sessions a run sends, built for its target (DESIGN.md 3.6).

The target is what the candidate pools run: their track intervals and DFlash block
size B (the run's flags for built-in replicas, the probed /server_info for --endpoint
servers) and their tokenizer (--tokenizer; else a server's `tokenizer_path` when it is
a readable local path; the built-in byte tokenizer for built-in replicas and servers
that report `tokenizer: byte`). The frozen and load suites are generated for it, so
boundary offsets -B..+1 hold exactly in the target's tokens; the committed frozen
suite is what a run at I = 128/256, B = 8 with the byte tokenizer and seed 0 sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.backends.info import block_size_of
from harness.config import ConfigError, RunConfig
from protocol.tokenizer import BYTE_TOKENIZER, Tokenizer, TokenizerError

GENERATED = ("frozen", "load")  # suites built from text, so they need the target's tokenizer


@dataclass(frozen=True)
class Target:
    """What the workload is built for; `describe()` is the plan's workload line."""

    intervals: tuple[int, ...]
    block_size: int
    tokenizer: Tokenizer | None  # None: an external target whose tokenizer is unknown (ids-only user files)
    tokenizer_source: str  # where it came from, for the plan
    max_context: int | None

    @property
    def tokenizer_name(self) -> str | None:
        return self.tokenizer.name if self.tokenizer is not None else None


def _local_path(value) -> str | None:
    return str(value) if isinstance(value, str) and value and Path(value).expanduser().exists() else None


def tokenizer_spec(cfg: RunConfig, infos: dict[str, dict]) -> tuple[str | None, str]:
    """(the tokenizer to load, where that came from); (None, why) when an external target's is unknown."""
    if cfg.tokenizer:
        return cfg.tokenizer, "--tokenizer"
    if not cfg.external and cfg.engine == "vllm":
        if (Path(cfg.model_path).expanduser() / "tokenizer.json").exists():
            return cfg.model_path, "--model (the vLLM model directory)"
        return None, f"--model {cfg.model_path} holds no tokenizer.json"
    if not cfg.external:
        return "byte", "the built-in engine"
    specs = {}
    for url in cfg.endpoint:
        info = infos.get(url) or {}
        path = _local_path(info.get("tokenizer_path"))
        if path is not None:
            specs[url] = path
        elif info.get("tokenizer") == "byte":
            specs[url] = "byte"
        else:
            return None, (f"endpoint {url} reports tokenizer_path {info.get('tokenizer_path')!r}, which is not a "
                          "readable local path")
    distinct = sorted(set(specs.values()))
    if len(distinct) > 1:
        raise ConfigError(f"the candidate endpoints report different tokenizers ({', '.join(distinct)}); pass "
                          "--tokenizer with the one they all serve")
    return distinct[0], f"{cfg.endpoint[0]}/server_info tokenizer_path"


def load_target_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer named by `spec` ("byte": the engine's own pure-Python copy, the fast path)."""
    if spec == "byte":
        return BYTE_TOKENIZER
    from protocol.hf_tokenizer import load_tokenizer

    try:
        return load_tokenizer(spec)
    except TokenizerError as e:
        raise ConfigError(f"--tokenizer: {e}") from None


def target_of(cfg: RunConfig, infos: dict[str, dict]) -> Target:
    """The target of this run: built-in replicas from the flags, external servers from their server infos.

    External pools that differ in B get the largest (its offsets -B..+1 hold the smaller blocks' too).
    """
    spec, source = tokenizer_spec(cfg, infos)
    tokenizer = load_target_tokenizer(spec) if spec is not None else None
    if not cfg.external:
        if tokenizer is not None and tokenizer.name != "byte" and cfg.engine == "builtin":
            raise ConfigError(f"--tokenizer {cfg.tokenizer}: built-in replicas run the byte tokenizer; --tokenizer "
                              "is for --endpoint servers")
        from workloads.schema import CONTEXT_TOKENS

        return Target(tuple(cfg.intervals), cfg.block_size, tokenizer, source, CONTEXT_TOKENS)
    cand = [infos.get(u) or {} for u in cfg.endpoint]
    intervals = tuple(sorted({int(i["mamba_track_interval"]) for i in cand if i.get("mamba_track_interval")}))
    blocks = [b for b in (block_size_of(i) for i in cand) if b]
    contexts = [int(i[k]) for i in cand for k in ("context_length", "max_context_length")
                if isinstance(i.get(k), int) and not isinstance(i.get(k), bool) and i[k] > 0]
    return Target(intervals or tuple(cfg.intervals), max(blocks) if blocks else cfg.block_size, tokenizer,
                  source, min(contexts) if contexts else None)


def load_sessions(cfg: RunConfig, target: Target) -> tuple[list, int]:
    """The workload's sessions for `target`, through the workloads package API, and how many generated sessions
    were left out because they could outgrow the target's context (ConfigError naming the flag)."""
    from workloads import load_suite
    from workloads.schema import WorkloadError

    flag = "--cover" if cfg.cover else f"--suite {cfg.suite}"
    if cfg.engine == "vllm" and cfg.suite == "vllm-boundary":
        if target.tokenizer is None:
            raise ConfigError(f"{flag}: its cases are cut to exact lengths in the model's tokenizer, and "
                              f"{target.tokenizer_source}: pass --tokenizer")
        return [], 0  # built per server from the block it reports, once it is up (harness/vllm/workload.py)
    if target.tokenizer is None and cfg.workload in GENERATED:
        raise ConfigError(f"{flag}: its prompts are text cut to exact lengths in the target's tokenizer, and "
                          f"{target.tokenizer_source}: pass --tokenizer (the served model's tokenizer.json or its "
                          "local model directory; nothing is downloaded)")
    generated = cfg.workload in GENERATED
    kwargs = {"intervals": target.intervals, "block_size": target.block_size, "seed": cfg.seed,
              "max_context": None if generated else target.max_context, "tokenizer": target.tokenizer}
    if cfg.num_requests:
        kwargs["num_requests"] = cfg.num_requests
    try:
        sessions = list(load_suite(cfg.workload, **kwargs))
    except (WorkloadError, TokenizerError, OSError, ValueError) as e:
        raise ConfigError(f"{flag}: {e}") from None
    if not generated or target.max_context is None:
        return sessions, 0
    fits = [s for s in sessions if s.max_total_tokens() <= target.max_context]
    return fits, len(sessions) - len(fits)


def describe(cfg: RunConfig, target: Target, left_out: int = 0) -> str:
    """The plan's line on what the workload was built for (and what of it did not fit the context)."""
    from workloads import committed_frozen_fits

    tok = (f"tokenizer {target.tokenizer_name} (from {target.tokenizer_source})" if target.tokenizer is not None
           else f"no tokenizer ({target.tokenizer_source}; ids sent as given, the report shows ids)")
    if cfg.workload == "frozen":
        committed = target.tokenizer is not None and committed_frozen_fits(
            target.intervals, target.block_size, target.tokenizer, cfg.seed)
        how = "the committed workloads/data/frozen.jsonl" if committed else (
            f"generated for intervals {','.join(map(str, target.intervals))} and B={target.block_size} (offsets "
            f"-{target.block_size}..+1 around multiples of each interval), seed {cfg.seed}")
    elif cfg.workload == "load":
        how = (f"seed {cfg.seed}, prompts at offsets -{target.block_size + 4}..+4 around multiples of "
               f"{','.join(map(str, target.intervals))}")
    elif cfg.workload == "cover":
        how = f"one session per (step, commit length) cell at B={target.block_size}"
    else:
        how = "a user file"
    dropped = (f"; {left_out} session(s) left out: they could outgrow the {target.max_context}-token context"
               if left_out else "")
    return f"workload: {how}; {tok}{dropped}"
