"""The SGLang engine profile: pools, their server flags, their environment, and the plan `--dry-run` shows.

The candidate pool runs SGLang with its radix cache on plus `--candidate-args`
verbatim (SGLang's own flags: `--speculative-algorithm DFLASH ...
--mamba-radix-cache-strategy extra_buffer` where the platform has them; SGLang's
CPU platform refuses both, shared/reference/sglang-cpu.md). The reference runs the
same model cold: the candidate's flags without speculation or radix-cache settings,
plus `--disable-radix-cache`. Every server gets `--tp-size` (it starts its own
tensor-parallel workers on the replica's GPUs), runs offline with a HOME of its
replica's own, and follows the profile of where it runs: on GPUs SGLang's own
defaults (CUDA graphs, its attention backend and memory fraction); on CPU SGLang's
CPU path (CPU engine, torch-native attention, no CUDA graphs, a small KV pool).
What each server really runs is read from its /server_info once it is up
(harness/targets/sglang.py), not assumed from these flags.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harness.models import card_args
from harness.plan import EngineSpec
from harness.targets.profile import Profile, Reserved, local_paths, parallel_reserved, reserved
from harness.targets.venv import isolated

if TYPE_CHECKING:
    from harness.replica import ServerSite

# SGLang's CPU path (shared/reference/sglang-cpu.md). On CPU SGLang sizes its KV pool from the machine's free
# memory, so whatever starts meanwhile is charged against it: a generous fraction with a token cap keeps the
# pool small and the start robust to neighbours (tests/sglang_setup/server.py measured both).
CPU_FLAGS = ("--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph")
MEMORY_FLAGS = ("--mem-fraction-static", "0.3", "--max-total-tokens", "32768")
COMMON = ("--random-seed", "0")
RADIX_OFF = "--disable-radix-cache"
SPEC_PREFIX = "--speculative-"  # every speculation flag of SGLang starts with it
STRATEGY_FLAGS = ("--mamba-radix-cache-strategy", "--mamba-scheduler-strategy")  # current name, pre-2026 alias
RADIX_ONLY = (*STRATEGY_FLAGS, "--mamba-track-interval")  # radix-cache settings the cold reference drops
# flags the harness sets itself, with the harness flag to use instead
RESERVED = {"--host": None, "--port": None, "--model-path": "--model", "--model": "--model",
            "--api-key": "--api-key", "--admin-api-key": "--api-key",
            RADIX_OFF: "--calibrate (a cold pool driven as a candidate)"}
# every spelling of SGLang's parallelism and device flags (argparse also takes a prefix of a long one: --tp); the
# parallelism that stays inside a replica's TP group (--ep-size, --attention-data-parallel-size, --dcp-size,
# --moe-dense-tp-size, ...) is SGLang's own and passes
PARALLEL = [*parallel_reserved(tp=("--tp-size", "--tensor-parallel-size"),
                               dp=("--dp-size", "--data-parallel-size", "--enable-dp-attention"),
                               pp=("--pp-size", "--pipeline-parallel-size"),
                               nodes=("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr"),
                               gpus=("--base-gpu-id", "--gpu-id-step")),
            Reserved(("--device",), "is set by the harness: the replica's placement chooses SGLang's GPU or CPU "
                     "profile (--device cuda or cpu)"),
            Reserved(("--config",), "is refused: give SGLang's flags themselves, which the harness reads to place "
                     "the replicas and to derive the cold reference")]
DRAFT_FLAGS = ("--speculative-draft-model-path", "--speculative-draft-model")  # where the drafter is read from
# `python -m sglang.launch_server` with the API key from the replica's environment (SPECGATE_API_KEY, set by
# harness/replica.py), so that it is never on a command line; the project tree (the working directory) is kept
# off sys.path, since SGLang's venv must not import this project's packages.
# SGLang prints its whole server_args, api_key included, into the log (RUN_DIR/logs): the key is written out of every
# line that goes through the server's sys.stdout / sys.stderr (its logging handlers and forked children included)
BOOTSTRAP = ("import os, runpy, sys\n"
             "sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
             "key = os.environ.pop('SPECGATE_API_KEY', '')\n"
             "class Redacted:\n"
             "    def __init__(self, f): self._f = f\n"
             "    def write(self, t): return self._f.write(t.replace(key, '<redacted>') if isinstance(t, str) else t)\n"
             "    def __getattr__(self, name): return getattr(self._f, name)\n"
             "if key: sys.stdout, sys.stderr = Redacted(sys.stdout), Redacted(sys.stderr)\n"
             "sys.argv = ['sglang.launch_server', *sys.argv[1:]] + (['--api-key', key] if key else [])\n"
             "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)\n")


class SGLangArgsError(ValueError):
    """A flag of --candidate-args cannot be used; the message names it."""


@dataclass(frozen=True)
class SGLangPool:
    """One pool's server flags and what they ask for (the server's /server_info has the last word)."""

    name: str
    role: str
    args: tuple[str, ...]  # pool flags (after the model's, CPU_FLAGS, MEMORY_FLAGS and COMMON)
    speculative: bool
    radix_cache: bool
    strategy: str | None  # --mamba-radix-cache-strategy where given
    block_size: int | None  # --speculative-dflash-block-size, else --speculative-num-draft-tokens


def _name(arg: str) -> str:
    return arg.split("=", 1)[0]


def value_of(args: tuple[str, ...], *flags: str) -> str | None:
    """The value of the last of `flags` in `args` (`--f v` or `--f=v`), None when absent."""
    found = None
    for i, a in enumerate(args):
        if _name(a) in flags:
            found = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else None)
    return found


def without(args: tuple[str, ...], keep) -> tuple[str, ...]:
    """`args` without the flags `keep(name)` rejects, and their values (a word after a flag that does not start
    with `--` is its value: SGLang's flags take at most one)."""
    out, skip = [], False
    for a in args:
        if skip and not a.startswith("--"):
            skip = False
            continue
        skip = False
        if a.startswith("--") and not keep(_name(a)):
            skip = "=" not in a
            continue
        out.append(a)
    return tuple(out)


def check_args(args: tuple[str, ...]) -> None:
    """SGLangArgsError naming the first flag the harness sets itself or refuses."""
    for a in args:
        name = _name(a)
        if name in RESERVED:
            instead = RESERVED[name]
            raise SGLangArgsError(f"{name} is set by the harness" + (f"; use the harness flag {instead}" if instead
                                                                     else " for every replica"))
    problem = reserved(args, PARALLEL)
    if problem:
        raise SGLangArgsError(problem)


def make_pool(name: str, role: str, args: tuple[str, ...]) -> SGLangPool:
    """A pool running `args`; what they ask for."""
    args = tuple(args)
    algorithm = value_of(args, "--speculative-algorithm")
    block = value_of(args, "--speculative-dflash-block-size") or value_of(args, "--speculative-num-draft-tokens")
    speculative = algorithm is not None and algorithm.upper() not in ("NONE", "")
    return SGLangPool(name, role, args, speculative, RADIX_OFF not in args, value_of(args, *STRATEGY_FLAGS),
                      int(block) if speculative and block and block.isdigit() else None)


def cold_args(candidate_args: tuple[str, ...]) -> tuple[str, ...]:
    """The reference's flags: the candidate's without speculation and radix-cache settings, the cache off."""
    return without(candidate_args, lambda n: not n.startswith(SPEC_PREFIX) and n not in RADIX_ONLY) + (RADIX_OFF,)


def pools(candidate_args: tuple[str, ...], calibrate: bool = False) -> tuple[list[SGLangPool], SGLangPool]:
    """The candidate pools (`sglang`, with --calibrate also `baseline`: the reference's flags on a server of its
    own) and the reference."""
    check_args(candidate_args)
    cands = [make_pool("sglang", "candidate", candidate_args)]
    if calibrate:
        cands.append(make_pool("baseline", "candidate", cold_args(candidate_args)))
    return cands, make_pool("reference", "reference", cold_args(candidate_args))


def model_args(model_dir: str) -> tuple[str, ...]:
    """--model-path and the flags the model card asks SGLang for (`sglang_args`, e.g. --dtype float32: SGLang
    serves an fp32 checkpoint as fp16 under its default --dtype auto)."""
    path, extra = card_args(model_dir, "sglang_args")
    return ("--model-path", path, *extra)


def server_args(model_dir: str, pool: SGLangPool, profile: Profile, tp_size: int) -> list[str]:
    """Every flag of a pool's servers but --host/--port (added per replica) and --api-key (from the environment),
    in `profile` at `tp_size` ranks. Later flags override earlier ones, so --candidate-args can change --dtype or
    the memory flags."""
    return [*model_args(model_dir), *profile.flags, "--tp-size", str(tp_size), *COMMON, *pool.args]


def node_paths(model_dir: str, pool: SGLangPool) -> tuple[tuple[str, str], ...]:
    """The directories a pool's servers read: the model, and the drafter and tokenizer its flags name."""
    found = [(model_dir, "--model")]
    for flags in (DRAFT_FLAGS, ("--tokenizer-path",)):
        found += [(path, f"{flags[0]} in --candidate-args") for path in local_paths([value_of(pool.args, *flags)])]
    return tuple(found)


def server_env(home: str) -> dict[str, str]:
    """Environment of one SGLang server (besides the inherited one), on every device: nothing downloaded, its own
    HOME (SGLang and its libraries write caches there)."""
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HOME": home, "HF_HOME": os.path.join(home, "hf"),
            "PYTHONUNBUFFERED": "1", "DO_NOT_TRACK": "1"}


# SGLang's CPU path: its CPU engine, and one OpenMP thread (Ray gives a replica one CPU)
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}


def environment(env: dict, site: ServerSite) -> dict:
    """A replica's SGLang environment on GPUs: its venv only (never this project's packages), a HOME in the log
    dir; CUDA_VISIBLE_DEVICES (the replica's GPUs) as the replica actor set it."""
    home = str(Path(site.log_dir) / f"{site.replica_id}-home")
    os.makedirs(home, exist_ok=True)
    env = isolated(env)
    env.pop("VIRTUAL_ENV", None)
    return {**env, **server_env(home)}


def cpu_environment(env: dict, site: ServerSite) -> dict:
    """A replica's SGLang environment on CPU: `environment`, with SGLang's CPU engine on one thread."""
    return {**environment(env, site), **CPU_ENV}


GPU = Profile("GPU", (), environment, "HOME=<run>/logs/<replica>-home HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "
              "CUDA_VISIBLE_DEVICES=<the replica's GPUs>")
CPU = Profile("CPU", (*CPU_FLAGS, *MEMORY_FLAGS), cpu_environment, "SGLANG_USE_CPU_ENGINE=1 "
              "HOME=<run>/logs/<replica>-home HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 "
              "CUDA_VISIBLE_DEVICES=''")


def engine_spec(pool: SGLangPool, tp_size: int, interval: int | None = None, block_size: int | None = None,
                strategy: str | None = None) -> EngineSpec:
    """The EngineSpec of a pool at `tp_size` ranks (records' `engine`); `interval`, `block_size`, `strategy`: what
    its servers report (a plain radix cache, without mamba state, has no checkpoint interval: strategy `radix`)."""
    radix = pool.radix_cache
    return EngineSpec(interval if radix else None, block_size or pool.block_size,
                      (strategy or pool.strategy or "radix") if radix else None, tp_size, None, pool.speculative,
                      radix, pool.args)
