"""The target interface: what a run's servers are, and how the harness starts, reads and checks them.

A target is one kind of thing a run gates: the built-in engine under Ray, vLLM
under Ray, already-running endpoints, ... (the registry is harness/targets/__init__.py).
harness/run.py calls only these methods, in this order:

1. its settings (`settings_class`, a TargetSettings declared beside it) are parsed and
   validated with the RunConfig, before anything else;
2. `probe`: what servers report before anything is written (already-running ones only);
3. `workload` and `sessions`: what the workload is built for (intervals, block size,
   tokenizer, context), and its sessions;
4. `plan`: the pools (candidates, the reference, --diagnose's and --calibrate's), and
   `describe`, what `--dry-run` prints;
5. `servers`: start the pools (a Ray replica actor per replica runs `launch(pool)`'s
   command) or wrap the endpoints; `settle`: read back what the started servers report
   and fix the plan to it; `check_reported`: a server that runs something else than its
   pool asked for stops the run, with a message that says so;
6. `finish`: lines for the log once the pools have been driven.

`Reported` is what a server says it runs, read from the server info its backend's
probe returns (SGLang's server-args names, whatever the backend).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from harness.backends import PROBE_KEY
from harness.backends.info import block_size_of, speculative, strategy_of
from harness.config import TargetSettings
from harness.errors import HarnessError
from harness.plan import Plan
from harness.workload import WorkloadTarget, load_sessions

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.pools import Pool

DETERMINISTIC_KEY = "enable_deterministic_inference"  # the built-in engine's and SGLang's server info field
DETERMINISTIC_FLAG = "--enable-deterministic-inference"  # the flag that sets it, in either server
CONTROLS = ("calibrate", "candidate_args", "diagnose", "cover")  # settings that add or change pools


@dataclass(frozen=True)
class Reported:
    """What a server says it runs; None where it does not say. `unknown`: what it cannot report at all (the
    report narrows)."""

    interval: int | None
    block_size: int | None
    strategy: str | None
    speculative: bool
    radix_cache: bool
    tokenizer: str | None  # its tokenizer's name where it gives one ("byte": the built-in engine's)
    tokenizer_path: str | None  # where it loaded its tokenizer from (a path on its own machine)
    context: int | None = None  # the longest sequence it serves
    unknown: tuple[str, ...] = ()


def reported_settings(info: dict) -> Reported:
    """The Reported of a probed server info (SGLang's names, either spelling of the strategy and block size)."""
    interval = info.get("mamba_track_interval")
    radix = not info.get("disable_radix_cache", False)
    name, path = info.get("tokenizer"), info.get("tokenizer_path")
    contexts = [int(info[k]) for k in ("context_length", "max_context_length")
                if isinstance(info.get(k), int) and not isinstance(info.get(k), bool) and info[k] > 0]
    return Reported(int(interval) if interval is not None else None, block_size_of(info),
                    strategy_of(info) if radix else None, speculative(info), radix,
                    str(name) if name else None, str(path) if path else None, min(contexts, default=None),
                    tuple((info.get(PROBE_KEY) or {}).get("unknown", ())))


# the server args that make a server a given pool's, compared by meaning (SGLang reports no speculation as null,
# the built-in engine as NONE)
IDENTITY = {"speculative_algorithm": lambda v: str(v or "NONE").upper(), "disable_radix_cache": bool,
            "inject_fault": lambda v: v or None, "mamba_track_interval": lambda v: None if v is None else int(v),
            "dtype": str, "tp_size": lambda v: int(v or 1)}


def other_server(pool: str, url: str, info: dict, started: dict) -> str | None:
    """Why the server at `url` is not one of `pool`'s replicas, started with the server args `started`: the first
    IDENTITY setting it reports otherwise (a setting it does not report is not compared); None when none."""
    for key, meaning in IDENTITY.items():
        if key in info and key in started and meaning(info[key]) != meaning(started[key]):
            return (f"pool {pool}: the server at {url} reports {key} {info[key]!r}, where this pool's replicas were "
                    f"started with {started[key]!r}: another server answers there")
    return None


class Target(ABC):
    """One kind of target. A subclass sets `settings_class` (its own settings, whose `key` and `managed` become the
    target's) and implements the abstract methods; `self.settings` is the run's instance of them."""

    settings_class: ClassVar[type[TargetSettings]] = TargetSettings
    key: ClassVar[str] = ""
    managed: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.key, cls.managed = cls.settings_class.key, cls.settings_class.managed

    def __init__(self, cfg: RunConfig) -> None:
        assert isinstance(cfg.target, self.settings_class), (cfg.target, self.settings_class)
        self.cfg = cfg
        self.settings = cfg.target

    # --- workload -------------------------------------------------------------------------------------------
    @abstractmethod
    def workload(self, infos: dict[str, dict]) -> WorkloadTarget:
        """What the workload is built for (infos: the probed servers' settings by URL, {} before any start)."""

    def sessions(self, target: WorkloadTarget) -> tuple[list, int]:
        """The sessions and how many were left out (harness/workload.py); ConfigError naming the flag."""
        return load_sessions(self.cfg, target)

    # --- pools ----------------------------------------------------------------------------------------------
    @abstractmethod
    def plan(self, sessions: list, infos: dict[str, dict]) -> Plan:
        """The pools and the sessions each serves; HarnessError naming a server that cannot take its role."""

    @abstractmethod
    def describe(self, plan: Plan) -> str:
        """What `--dry-run` prints (nothing is started)."""

    # --- servers --------------------------------------------------------------------------------------------
    def probe(self, generate: bool) -> dict[str, dict]:
        """URL -> server info of servers that run already (with `generate`, one short request each); {} for
        targets that start their own. HarnessError says what is wrong."""
        return {}

    @abstractmethod
    def servers(self, plan: Plan, run_dir: Path, run_id: str) -> AbstractContextManager[tuple[list[Pool], Pool]]:
        """A context holding the started (or wrapped) pools, (candidates, reference); it stops what it started."""

    def settle(self, plan: Plan, cands: list[Pool], ref: Pool, infos: dict[str, dict]
               ) -> tuple[Plan, dict[str, dict]]:
        """The plan and server infos once the servers run (a target that learns its pools' settings from its
        servers fixes the plan here); HarnessError when they cannot be gated."""
        return plan, infos

    def reported(self, info: dict) -> Reported:
        """What a server of this target says it runs."""
        return reported_settings(info)

    async def check_servers(self, http, pools, infos: dict[str, dict]) -> None:
        """Read each replica's /server_info (`infos`: those probed already) and raise HarnessError where one
        contradicts its pool (`check_reported`): a replica answering for another server is named here, before any
        request. Each pool keeps its first replica's as `server_info`."""
        for pool in pools:
            for replica in pool.replicas:
                info = infos.get(replica.url) or await pool.backend.server_info(http, replica.url)
                if replica is pool.replicas[0]:
                    pool.server_info = info
                problem = self.check_reported(pool, replica.url, info)
                if problem:
                    raise HarnessError(problem)

    def check_reported(self, pool, url: str, info: dict) -> str | None:
        """Why the server at `url` contradicts what `pool` (name, role, engine) asked for; None when it agrees.
        Here: a candidate's checkpoint interval, where the plan has one, and under --deterministic the mode."""
        interval = self.reported(info).interval
        planned = pool.engine.interval
        if pool.role == "candidate" and interval is not None and planned is not None and interval != planned:
            return f"pool {pool.name}: the server reports mamba_track_interval {interval}"
        return self.deterministic(pool, info)[0] if self.cfg.deterministic else None

    def deterministic(self, pool, info: dict) -> tuple[str | None, str]:
        """Under --deterministic: (why `pool`'s server cannot be taken to run the target's deterministic mode, None
        when it can; what confirms it, for config.json). Here: the server's own report, DETERMINISTIC_KEY (the
        built-in engine's and SGLang's server info); one that reports it off, or does not report it, is refused."""
        value = info.get(DETERMINISTIC_KEY)
        if value is True:
            return None, f"the server reports {DETERMINISTIC_KEY}: true"
        said = (f"does not report {DETERMINISTIC_KEY}" if value is None
                else f"reports {DETERMINISTIC_KEY}: {json.dumps(value)}")
        return (f"pool {pool.name}: --deterministic asks every server for its deterministic mode, and this one {said}"
                f": it runs without it (start it with {DETERMINISTIC_FLAG}, or drop --deterministic)", said)

    def window_unprobed(self, backend_reason: str | None) -> str | None:
        """Why restored turns get no restore-window probe (None: they do); `backend_reason`: what the servers'
        protocol says (harness/backends: None where it can score a prompt)."""
        return "--no-restore-window" if self.cfg.no_restore_window else backend_reason

    def finish(self, run_dir: Path) -> list[str]:
        """Lines for the log after the pools were driven (read from the run directory)."""
        return []
