"""What the real engines' targets (vLLM, SGLang) do alike: pools from a profile of flags, servers from a venv of
their own, probed once they are up and held to what their pools asked for.

A profile module (vllm_profile.py, sglang_profile.py) says which flags each pool's
servers get and what those flags ask for (a frozen "asked" pool). Here, once: the
plan (each candidate serves every session), `--dry-run`'s text, the probe of every
replica (a candidate whose first request crashes is kept, so the crash is recorded
as its failure), the check of each server's report against its pool, and the
settling of each pool's engine on what its servers report. Each engine's module keeps
only what is its own: its profile, its contradiction rules, its notes.

Each engine has two profiles, chosen by where its replica runs (`Profile`): on GPUs its
own defaults (CUDA graphs on, its attention backend, its memory fraction), on CPU what
its CPU build needs. Either way the server starts its own tensor-parallel workers
(`--tp-size`), inside the one placement-group bundle that holds all of the replica's
GPUs; flags that would start, place or shard ranks otherwise are refused (`Reserved`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shlex
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import aiohttp

from harness.backends import ReplicaFailure, RequestError
from harness.errors import HarnessError
from harness.plan import REFERENCE_POOL, EngineSpec, Plan, PoolPlan
from harness.targets.base import Reported
from harness.targets.managed import Devices, ManagedTarget
from harness.targets.venv import InterpreterNotFound, Venv, find_python
from harness.workload import WorkloadTarget, from_flags

if TYPE_CHECKING:
    from harness.replica import ServerSite
    from harness.targets.managed import ManagedSettings


@dataclass(frozen=True)
class Profile:
    """What a managed engine's servers get where they run: flags before the pool's own, and the environment
    function (module-level: it travels to the replica actor by reference)."""

    name: str  # "GPU" or "CPU"
    flags: tuple[str, ...]
    environment: Callable[[dict, ServerSite], dict]
    env_line: str  # what --dry-run says of the environment


def profile_for(devices: Devices, gpu: Profile, cpu: Profile) -> Profile:
    """The profile of a replica placed on `devices`."""
    return gpu if devices.on_gpu else cpu


@dataclass(frozen=True)
class Reserved:
    """Flags of an engine that the harness sets or cannot honour, each spelling of them, and why."""

    spellings: tuple[str, ...]
    why: str


def flag_name(arg: str) -> str:
    """The flag an argument names: `--a_b=1` is `--a-b` (vLLM reads underscores as dashes)."""
    name = arg.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def reserved(args: Sequence[str], table: Sequence[Reserved]) -> str | None:
    """Why the first reserved flag of `args` is refused (naming it), None when there is none. A long flag is also
    caught by a prefix of it, which argparse (SGLang's, vLLM's) takes for the whole flag."""
    for arg in args:
        if not arg.startswith("-") or arg.lstrip("-").replace(".", "").isdigit():
            continue
        name = flag_name(arg)
        for entry in table:
            if name in entry.spellings:
                return f"{name} {entry.why}"
        if len(name) >= 4 and name.startswith("--"):
            for entry in table:
                full = next((f for f in entry.spellings if f.startswith(name)), None)
                if full is not None:
                    return f"{name} (short for {full}) {entry.why}"
    return None


def parallel_reserved(tp: Sequence[str], dp: Sequence[str], pp: Sequence[str], nodes: Sequence[str],
                      gpus: Sequence[str]) -> list[Reserved]:
    """The parallelism and device flags every managed engine refuses, by their spellings in that engine."""
    return [Reserved(tuple(tp), "is set by the harness from --tp-size, which also reserves the replica's GPUs: give "
                     "--tp-size N"),
            Reserved(tuple(dp), "is refused: data parallelism is the harness's --replicas (each replica in a "
                     "placement group of its own, with GPUs of its own)"),
            Reserved(tuple(pp), "is refused: pipeline parallelism is not supported (a replica is its "
                     "tensor-parallel ranks on one node); use --tp-size"),
            Reserved(tuple(nodes), "is refused: a replica runs on one node (its STRICT_PACK placement group)"),
            Reserved(tuple(gpus), "is set by the harness: a replica's GPUs are those of its placement group, "
                     "given in CUDA_VISIBLE_DEVICES (--device, --gpus-per-rank)")]


def local_paths(values: Sequence[str | None]) -> list[str]:
    """Those of `values` that name a filesystem path (not a hub id or a method name): absolute, or starting with
    `.` or `~`."""
    return [v for v in values if v and (os.path.isabs(v) or v.startswith((".", "~")))]


async def probe_replica(backend, http, url: str, role: str) -> dict:
    """backend.probe; a candidate whose probe request fails on the server's side (HTTP 5xx, connection lost:
    it crashed on its first request) is probed for its settings only and kept, so the run records the crash as
    the candidate's failure (exit 1), with its log lines, instead of stopping as a harness failure."""
    try:
        return await backend.probe(http, url, role)
    except RequestError as e:
        if role != "candidate" or not ("HTTP 5" in str(e) or "failed (" in str(e) and "HTTP" not in str(e)):
            raise
        print(f"[specgate] candidate {url}: {e}; the run goes on and records what it does")
        try:
            info = await backend.probe(http, url, role, generate=False)
        except (RequestError, ReplicaFailure):
            info = {"specgate_probe": {"declared": [], "notes": []}}
        info.setdefault("specgate_probe", {}).setdefault("notes", []).append(f"probe request failed: {e}")
        return info


def summary(infos: dict[str, dict], keys: tuple[str, ...]) -> str:
    """One line per server: what it reported of `keys` (for the log)."""
    return "\n".join(f"  {url}: " + json.dumps({k: info.get(k) for k in keys}) for url, info in infos.items())


class ProfileTarget(ManagedTarget):
    """A real engine's target: its pools come from its profile module, each candidate serves every session (its
    interval is what its servers report, known once they are up), and its interpreter lives in a venv of its own.

    A subclass gives its venv, the server-info keys its log summary shows, and the profile hooks below."""

    venv: ClassVar[Venv]
    summary_keys: ClassVar[tuple[str, ...]] = ()
    settings: ManagedSettings

    # --- the profile ----------------------------------------------------------------------------------------
    @abstractmethod
    def python_flag(self) -> str | None:
        """The interpreter the user gave (--vllm-python / --sglang-python), None for the venv's default."""

    @abstractmethod
    def profile_pools(self) -> tuple[list, object]:
        """(candidate pools, reference pool) of the profile, from the flags ("asked" pools)."""

    @abstractmethod
    def asked(self, name: str, role: str, args: tuple[str, ...]) -> object:
        """The profile's asked pool running `args` (what a pool's flags ask its servers for)."""

    @abstractmethod
    def engine_spec(self, asked, reported: Reported | None = None) -> EngineSpec:
        """The EngineSpec of an asked pool, settled on what its servers report where `reported` is given."""

    @abstractmethod
    def contradiction(self, name: str, asked, info: dict) -> str | None:
        """Why a server's info contradicts what its pool `name` asked for; None when it agrees or does not say."""

    @abstractmethod
    def server_line(self, python: str, asked, devices: Devices) -> str:
        """`--dry-run`'s server command of an asked pool placed on `devices` (its profile)."""

    @abstractmethod
    def pool_line(self, asked) -> str:
        """`--dry-run`'s words on what an asked pool runs (speculation, caching)."""

    def notes(self, asked_pools: list) -> list[str]:
        """`--dry-run`'s closing lines (environment, what is read back, pools not started)."""
        return []

    def suite_line(self, n_sessions: int) -> str:
        """`--dry-run`'s words on the sessions each candidate pool serves."""
        return f"{n_sessions} sessions"

    def noted(self, pool, asked, info: dict) -> dict:
        """A probed server info, with what the target adds to it before it is kept (e.g. what it cannot report)."""
        return info

    def settled_notes(self, cands: list) -> list[str]:
        """Lines for the log once every server was probed."""
        return []

    def settled_sessions(self, cands: list) -> tuple | None:
        """Sessions derived from what the servers report (None: the planned ones stand)."""
        return None

    # --- shared ---------------------------------------------------------------------------------------------
    def workload(self, infos: dict[str, dict]) -> WorkloadTarget:
        """The flags' intervals and B, in --tokenizer or the --model directory's tokenizer."""
        cfg, model = self.cfg, self.settings.model_path
        if cfg.tokenizer:
            return from_flags(cfg, cfg.tokenizer, "--tokenizer")
        if (Path(model).expanduser() / "tokenizer.json").exists():
            return from_flags(cfg, model, f"--model (the {self.venv.engine} model directory)")
        return from_flags(cfg, None, f"--model {model} holds no tokenizer.json")

    def plan(self, sessions: list, infos: dict[str, dict]) -> Plan:
        """Pools from the flags (the profile's pools); each candidate serves every session."""
        cfg = self.cfg
        cands, ref = self.profile_pools()
        plans = tuple(PoolPlan(p.name, "candidate", self.engine_spec(p), cfg.replicas, tuple(sessions)) for p in cands)
        return Plan(plans, PoolPlan(REFERENCE_POOL, "reference", self.engine_spec(ref), cfg.reference_replicas),
                    cfg.concurrency, 0)

    def describe(self, plan: Plan) -> str:
        """Pools, commands, environment, and what is read from the servers (nothing is started)."""
        cfg = self.cfg
        try:
            python = find_python(self.venv, self.python_flag())
        except InterpreterNotFound as e:
            python = f"<no {self.venv.engine} interpreter: {e}>"
        cands, ref = self.profile_pools()
        n_sessions = len(plan.candidates[0].sessions) if plan.candidates else 0
        lines = [f"engine {self.venv.engine} ({python}), backend {cfg.backend}; model "
                 f"{Path(self.settings.model_path).expanduser().resolve()}",
                 f"placement: {self.placement_text()}",
                 f"suite {cfg.workload}: {self.suite_line(n_sessions)} per candidate pool and sweep point, "
                 f"concurrency {','.join(map(str, cfg.concurrency))}"]
        variants = self.dry_run_devices()
        for p in (*cands, ref):
            replicas = cfg.reference_replicas if p.role == "reference" else cfg.replicas
            lines.append(f"pool {p.name} ({p.role}): {replicas} replica(s), tp {cfg.tp_size}, {self.pool_line(p)}")
            lines += [f"  server{' on GPUs' if d.on_gpu else ' on CPU' if len(variants) > 1 else ''}: "
                      + self.server_line(python, p, d) for d in variants]
        lines += self.notes([*cands, ref])
        return "\n".join(lines) + (f"\n{plan.workload}" if plan.workload else "")

    def settle(self, plan: Plan, cands: list, ref, infos: dict[str, dict]) -> tuple[Plan, dict[str, dict]]:
        """Probe every replica; a server that contradicts its pool stops the run. Each pool's engine becomes what
        its servers report (and, where the target derives them, its sessions)."""
        try:
            infos = asyncio.run(self._probe_pools(cands, ref))
        except (RequestError, ReplicaFailure) as e:
            raise HarnessError(str(e)) from None
        print(f"{self.venv.engine} servers report:\n" + summary(infos, self.summary_keys))
        for line in self.settled_notes(cands):
            print(line)
        sessions = self.settled_sessions(cands)
        engines = {p.name: p.engine for p in cands}
        fixed = tuple(PoolPlan(p.name, p.role, engines[p.name], p.replicas,
                               p.sessions if sessions is None else sessions) for p in plan.candidates)
        return dataclasses.replace(plan, candidates=fixed), infos

    async def _probe_pools(self, cands: list, ref) -> dict[str, dict]:
        infos: dict[str, dict] = {}
        async with aiohttp.ClientSession() as http:
            for pool in (*cands, ref):
                asked = self.asked(pool.name, pool.role, pool.engine.args)
                for r in pool.replicas:
                    info = await probe_replica(pool.backend, http, r.url, pool.role)
                    problem = self.contradiction(pool.name, asked, info)
                    if problem:
                        raise RequestError(problem)
                    infos[r.url] = self.noted(pool, asked, info)
                pool.server_info = infos[pool.replicas[0].url]
                pool.engine = self.engine_spec(asked, self.reported(pool.server_info))
        return infos

    def check_reported(self, pool, url: str, info: dict) -> str | None:
        """The profile's contradictions, then the interval check every target has."""
        return (self.contradiction(pool.name, self.asked(pool.name, pool.role, pool.engine.args), info)
                or super().check_reported(pool, url, info))


def command_line(python: str, module: str, args: list[str]) -> str:
    """A server's command line as `--dry-run` shows it."""
    return shlex.join([python, "-m", module, *args, "--host", "HOST", "--port", "PORT"])
