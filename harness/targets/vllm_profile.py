"""The vLLM engine profile: pools, their server flags, and the plan `--dry-run` shows.

One candidate pool runs `--candidate-args` verbatim (vLLM's own flags, e.g.
`--speculative-config '{...}' --enable-prefix-caching`); `--diagnose` adds a
speculation-only pool (prefix caching off) and a cache-only pool (no speculative
config) derived from the same flags; one whose configuration is the candidate's
own (a candidate without prefix caching is already speculation-only) is not started.
The reference pool runs the same model with neither. Every server gets
`--tensor-parallel-size` (it starts its own tensor-parallel workers, with vLLM's `mp`
executor, on the replica's GPUs) and the flags of its profile (GPU: vLLM's defaults,
CUDA graphs on; CPU: eager). What each server really runs (its prefix-cache block, whether it
speculates, with how many draft tokens) is read from its /metrics once it is up,
not assumed from the flags (harness/targets/vllm.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from harness.models import card_args
from harness.plan import EngineSpec
from harness.targets.profile import Profile, Reserved, local_paths, parallel_reserved, reserved

SERVED_NAME = "specgate-target"
# flags the harness sets itself (per replica or per pool), with the harness flag to use instead
RESERVED = {"--host": None, "--port": None, "--model": "--model", "--served-model-name": None,
            "--api-key": "--api-key"}
_DP = ("size", "rank", "start-rank", "size-local", "address", "rpc-port", "backend", "hybrid-lb", "external-lb",
       "multi-port-external-lb", "supervisor-port")
# every spelling of vLLM's parallelism and device flags (short ones, and a prefix of a long one, which argparse
# takes for it); what stays inside a replica's TP group (--enable-expert-parallel, -dcp) is vLLM's own and passes
PARALLEL = [*parallel_reserved(
    tp=("--tensor-parallel-size", "-tp"),
    dp=(*(f"--data-parallel-{d}" for d in _DP), "--no-data-parallel-hybrid-lb", "--no-data-parallel-external-lb",
        "-dp", "-dpn", "-dpr", "-dpl", "-dpa", "-dpp", "-dpb", "-dph", "-dpe", "-dpm"),
    pp=("--pipeline-parallel-size", "-pp"),
    nodes=("--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--master-port", "--headless"),
    gpus=("--device-ids",)),
    Reserved(("--prefill-context-parallel-size", "-pcp"), "is refused: prefill context parallelism adds ranks "
             "beyond --tp-size, which the harness does not reserve"),
    Reserved(("--distributed-executor-backend",), "is set by the harness: mp, so that the server starts its "
             "tensor-parallel workers itself on the replica's GPUs"),
    Reserved(("--config",), "is refused: give vLLM's flags themselves, which the harness reads to place the "
             "replicas and to derive the reference")]
SPEC_FLAG = "--speculative-config"
ALIASES = {"-sc": SPEC_FLAG}  # vLLM's short spellings of flags the profile reads
CACHE_ON, CACHE_OFF = "--enable-prefix-caching", "--no-enable-prefix-caching"
# what every server of a run is started with (on top of the model card's flags, e.g. --dtype)
COMMON = ("--seed", "0", "--max-model-len", "2048", "--enable-prompt-tokens-details", "--return-tokens-as-token-ids")
CPU_FLAGS = ("--enforce-eager",)  # the CPU profile: no CUDA graphs to capture


class VLLMArgsError(ValueError):
    """A flag of --candidate-args cannot be used; the message names it."""


@dataclass(frozen=True)
class VLLMPool:
    """One pool's server flags and what they ask for (the server's /metrics has the last word)."""

    name: str
    role: str
    args: tuple[str, ...]  # pool flags (after COMMON and the model card's)
    speculative: bool
    prefix_caching: bool
    draft_tokens: int | None


def _flag_name(arg: str) -> str:
    name = arg.split("=", 1)[0]
    return ALIASES.get(name, name)


def _lenient_json(raw: str):
    """JSON, or JSON whose quotes a shell ate (`{method:ngram,num_speculative_tokens:4}`): keys and bare words
    quoted again (numbers, true, false and null stay as they are)."""
    try:
        return json.loads(raw)
    except ValueError:
        pass
    word = r"[A-Za-z_][A-Za-z0-9_.\-]*"
    fixed = re.sub(rf"([{{,]\s*)({word})\s*:", r'\1"\2":', raw)
    fixed = re.sub(rf":\s*({word})\s*(?=[,}}])",
                   lambda m: ":" + (m.group(1) if m.group(1) in ("true", "false", "null") else f'"{m.group(1)}"'),
                   fixed)
    return json.loads(fixed)


def normalized(args: tuple[str, ...]) -> tuple[str, ...]:
    """`args` with the --speculative-config value as strict JSON (what vLLM parses)."""
    spec = spec_config(args)
    if spec is None:
        return tuple(args)
    return without(args, SPEC_FLAG) + (SPEC_FLAG, json.dumps(spec, separators=(",", ":")))


def spec_config(args: tuple[str, ...]) -> dict | None:
    """The --speculative-config JSON in `args` (None without one); VLLMArgsError when it is not JSON."""
    for i, a in enumerate(args):
        if _flag_name(a) == SPEC_FLAG:
            raw = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            try:
                value = _lenient_json(raw)
            except ValueError:
                raise VLLMArgsError(f"{SPEC_FLAG} must be a JSON object, got {raw!r} (quote it for the shell: "
                                    f"--candidate-args \"{SPEC_FLAG} '{{...}}'\")") from None
            if not isinstance(value, dict):
                raise VLLMArgsError(f"{SPEC_FLAG} must be a JSON object, got {raw!r}")
            return value
    return None


def caching_of(args: tuple[str, ...]) -> bool:
    """Whether the flags ask for prefix caching (vLLM's default is on; the last of on/off wins)."""
    state = True
    for a in args:
        if a == CACHE_ON:
            state = True
        elif a == CACHE_OFF:
            state = False
    return state


def check_args(args: tuple[str, ...]) -> None:
    """VLLMArgsError naming the first flag the harness reserves or refuses, or a malformed --speculative-config."""
    for a in args:
        name = _flag_name(a)
        if name in RESERVED:
            instead = RESERVED[name]
            raise VLLMArgsError(f"{name} is set by the harness for every replica"
                                + (f"; use the harness flag {instead}" if instead else ""))
    problem = reserved(args, PARALLEL)
    if problem:
        raise VLLMArgsError(problem)
    spec_config(args)


def draft_tp_problem(args: tuple[str, ...], tp_size: int) -> str | None:
    """Why the drafter's tensor parallelism (--speculative-config draft_tensor_parallel_size) cannot run in a
    replica of `tp_size` ranks, None when it can (vLLM runs a drafter on 1 rank or on the target's)."""
    draft = (spec_config(args) or {}).get("draft_tensor_parallel_size")
    if draft is None or draft in (1, tp_size):
        return None
    return (f"{SPEC_FLAG} draft_tensor_parallel_size {draft}: the drafter runs on 1 rank or on the target's "
            f"--tp-size {tp_size}")


def without(args: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """`args` without `flag` (and its value when given as a separate word)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if _flag_name(a) == flag:
            skip = "=" not in a and flag == SPEC_FLAG
            continue
        out.append(a)
    return tuple(out)


def make_pool(name: str, role: str, args: tuple[str, ...]) -> VLLMPool:
    """A pool running `args` (the --speculative-config made strict JSON)."""
    args = normalized(args)
    spec = spec_config(args)
    drafts = spec.get("num_speculative_tokens") if spec else None
    return VLLMPool(name, role, args, spec is not None, caching_of(args), int(drafts) if drafts else None)


def diagnose_pools(candidate_args: tuple[str, ...]) -> list[VLLMPool]:
    """The two halves of the candidate's configuration: `vllm-spec` (prefix caching off) and `vllm-cache` (no
    speculative config, prefix caching on)."""
    base = without(without(candidate_args, CACHE_ON), CACHE_OFF)
    return [make_pool("vllm-spec", "candidate", base + (CACHE_OFF,)),
            make_pool("vllm-cache", "candidate", without(base, SPEC_FLAG) + (CACHE_ON,))]


def same_path(a: VLLMPool, b: VLLMPool) -> bool:
    """Whether a --diagnose pool runs its candidate's configuration: both are derived from the same flags and differ
    at most in speculation and prefix caching."""
    return (a.speculative, a.prefix_caching) == (b.speculative, b.prefix_caching)


def skipped_diagnose_pools(candidate_args: tuple[str, ...]) -> list[str]:
    """The --diagnose pools not started because the candidate already runs their configuration, one line each."""
    cand = make_pool("vllm", "candidate", candidate_args)
    what = {"vllm-spec": "speculation without prefix caching", "vllm-cache": "prefix caching without speculation"}
    return [f"pool {p.name} not started: the candidate vllm already runs {what[p.name]} (its results stand for "
            "both in the diagnosis)" for p in diagnose_pools(candidate_args) if same_path(p, cand)]


def pools(candidate_args: tuple[str, ...], diagnose: bool, calibrate: bool = False
          ) -> tuple[list[VLLMPool], VLLMPool]:
    """The candidate pools (`vllm`, with --diagnose also `vllm-spec` and `vllm-cache`, with --calibrate also
    `baseline`: the reference's flags on a server of its own) and the reference."""
    check_args(candidate_args)
    cands = [make_pool("vllm", "candidate", candidate_args)]
    if diagnose:
        cands += [p for p in diagnose_pools(candidate_args) if not same_path(p, cands[0])]
    ref_args = without(without(without(candidate_args, SPEC_FLAG), CACHE_ON), CACHE_OFF) + (CACHE_OFF,)
    if calibrate:
        cands.append(make_pool("baseline", "candidate", ref_args))
    return cands, make_pool("reference", "reference", ref_args)


def model_args(model_dir: str) -> tuple[str, ...]:
    """The model's own flags: --model, --served-model-name and those its model card asks for (e.g. --dtype)."""
    path, extra = card_args(model_dir, "vllm_args")
    return ("--model", path, "--served-model-name", SERVED_NAME, *extra)


def tp_args(tp_size: int) -> tuple[str, ...]:
    """The replica's tensor parallelism: vLLM's own workers (the mp executor) on the replica's GPUs."""
    return ("--tensor-parallel-size", str(tp_size)) + (("--distributed-executor-backend", "mp") if tp_size > 1
                                                        else ())


def server_args(model_dir: str, pool: VLLMPool, profile: Profile, tp_size: int) -> list[str]:
    """Every flag of a pool's servers but --host/--port (added per replica), in `profile` at `tp_size` ranks.
    Later flags override earlier ones, so --candidate-args can change --dtype or --max-model-len."""
    return [*model_args(model_dir), *profile.flags, *tp_args(tp_size), *COMMON, *pool.args]


def node_paths(model_dir: str, pool: VLLMPool) -> tuple[tuple[str, str], ...]:
    """The directories a pool's servers read: the model, and the drafter and tokenizer its flags name."""
    found = [(model_dir, "--model")]
    drafter = (spec_config(pool.args) or {}).get("model")
    found += [(p, f"{SPEC_FLAG} model") for p in local_paths([drafter if isinstance(drafter, str) else None])]
    tokenizer = next((a.split("=", 1)[1] if "=" in a else pool.args[i + 1] for i, a in enumerate(pool.args)
                      if _flag_name(a) == "--tokenizer" and ("=" in a or i + 1 < len(pool.args))), None)
    return tuple(found + [(p, "--tokenizer in --candidate-args") for p in local_paths([tokenizer])])


def engine_spec(pool: VLLMPool, tp_size: int, interval: int | None = None):
    """The EngineSpec of a pool at `tp_size` ranks (records' `engine`): block size = draft tokens + 1 (the verify
    width)."""
    return EngineSpec(interval if pool.prefix_caching else None,
                      pool.draft_tokens + 1 if pool.draft_tokens else None,
                      "vllm-prefix-cache" if pool.prefix_caching else None, tp_size, None, pool.speculative,
                      pool.prefix_caching, pool.args)
