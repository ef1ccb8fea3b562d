"""What the real engines' targets (vLLM, SGLang) do alike: pools from a profile of flags, servers from a venv of
their own, probed once they are up and held to what their pools asked for.

A profile module (vllm_profile.py, sglang_profile.py) says which flags each pool's
servers get and what those flags ask for (a frozen "asked" pool). Here, once: the
plan (each candidate serves every session), `--dry-run`'s text, the probe of every
replica (a candidate whose first request crashes is kept, so the crash is recorded
as its failure), the check of each server's report against its pool, and the
settling of each pool's engine on what its servers report. Each engine's module keeps
only what is its own: its profile, its contradiction rules, its notes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import aiohttp

from harness.backends import ReplicaFailure, RequestError
from harness.errors import HarnessError
from harness.plan import REFERENCE_POOL, EngineSpec, Plan, PoolPlan
from harness.targets.base import Reported
from harness.targets.managed import ManagedTarget
from harness.targets.venv import InterpreterNotFound, Venv, find_python
from harness.workload import WorkloadTarget, from_flags

if TYPE_CHECKING:
    from harness.targets.managed import ManagedSettings


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
    def server_line(self, python: str, asked) -> str:
        """`--dry-run`'s server command of an asked pool."""

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
                 f"placement: Ray ({cfg.address or 'auto on a ray-up node, else a local Ray'}), one actor per replica",
                 f"suite {cfg.workload}: {self.suite_line(n_sessions)} per candidate pool and sweep point, "
                 f"concurrency {','.join(map(str, cfg.concurrency))}"]
        for p in (*cands, ref):
            replicas = cfg.reference_replicas if p.role == "reference" else cfg.replicas
            lines.append(f"pool {p.name} ({p.role}): {replicas} replica(s), {self.pool_line(p)}")
            lines.append("  server: " + self.server_line(python, p))
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
