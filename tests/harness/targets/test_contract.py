"""The same contract, run on every registered target (harness/targets/__init__.py TARGETS).

For each target, its case (case_<key>.py) gives a valid configuration and what its
servers report; the checks: the registry and validation, probe parsing (what
`reported` reads from a server info), workload derivation (what the sessions are
built for, and that the plan's pools serve them), the controls it offers (--diagnose
and --calibrate add pools; the others are refused with a message), what a started
target's replicas run and what `--dry-run` shows of it, and contradiction checks (a
server that reports what its pool asked passes, one that reports something else is
named). A target without a case fails here, naming the file to add.
"""

from __future__ import annotations

import importlib
import re
import shlex
from dataclasses import replace

import pytest

from harness.calibrate import BASELINE_POOL
from harness.cli import from_argv
from harness.config import ConfigError
from harness.run import make_plan
from harness.targets import CONTROLS, TARGETS, engines, make_target, offers, refusal, target_key
from harness.targets.managed import ManagedTarget
from harness.workload import WorkloadTarget
from reports.controls import is_control
from tests.harness.targets.contract import load_case

KEYS = sorted(TARGETS)


class _Probed:
    """`target.probe` answered from the case (the real probe is HTTP, tested with each backend)."""

    def __init__(self, target, infos):
        self.target, self.infos = target, infos

    def __call__(self, generate: bool) -> dict:
        return self.infos


def _target(case, *extra: str):
    target = make_target(from_argv([*case.argv, *extra], {})[0])
    target.probe = _Probed(target, case.infos)
    return target


def _plan(case, *extra: str):
    target = _target(case, *extra)
    return target, make_plan(target)[0]


def _url(pool) -> str:
    return pool.endpoints[0] if pool.endpoints else f"http://{pool.name}-r0"


def _launch(target, pool):
    return target.launch(pool, target.dry_run_devices()[0]) if isinstance(target, ManagedTarget) else None


def test_the_registry_names_every_target_by_its_key():
    assert KEYS == ["builtin", "endpoints", "sglang", "vllm"]
    assert all(cls.key == key for key, cls in TARGETS.items())
    assert engines() == ("builtin", "vllm", "sglang") and all(TARGETS[k].managed for k in engines())
    assert all(issubclass(cls, ManagedTarget) == cls.managed for cls in TARGETS.values())


@pytest.mark.parametrize("key", KEYS)
def test_a_valid_config_selects_the_target_and_bad_ones_are_refused_by_flag(key, tmp_path):
    case = load_case(key, tmp_path)
    cfg, _ = from_argv(case.argv, {})
    assert target_key(cfg) == key and type(make_target(cfg)) is TARGETS[key]
    assert cfg.gate.drift_tolerance == cfg.target.drift_tolerance and cfg.key == key
    for extra, message in case.refused:
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            from_argv([*case.argv, *extra], {})


@pytest.mark.parametrize("key", KEYS)
def test_probe_parsing_reads_what_each_pool_s_servers_report(key, tmp_path):
    case = load_case(key, tmp_path)
    target, plan = _plan(case)
    for pool in (*plan.candidates, plan.reference):
        info = case.agreeing(pool, _launch(target, pool))
        assert target.reported(info) == case.reported(pool), pool.name


@pytest.mark.parametrize("key", KEYS)
def test_the_workload_is_derived_for_what_the_target_runs(key, tmp_path):
    case = load_case(key, tmp_path)
    target, plan = _plan(case)
    workload = target.workload(case.infos)
    assert isinstance(workload, WorkloadTarget)
    assert (workload.intervals, workload.block_size, workload.tokenizer_name) == case.workload
    assert [p.name for p in (*plan.candidates, plan.reference)] == case.pools
    assert plan.tokenizer is not None and plan.tokenizer.name == case.workload[2] and plan.workload
    assert all(p.role == "candidate" and p.sessions for p in plan.candidates) and plan.reference.role == "reference"
    sessions = {s.session_id: s for s in target.sessions(workload)[0]}
    for pool in plan.candidates:  # a pool serves the sessions for its interval, or every session
        assert all(sessions[s.session_id] == s for s in pool.sessions)
        assert all(s.interval in (None, pool.engine.interval) for s in pool.sessions) or \
            len(pool.sessions) == len(sessions)
    assert plan.total_candidate_requests == sum(p.requests_per_point for p in plan.candidates) * len(plan.concurrency)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("control", CONTROLS)
def test_controls_add_pools_where_offered_and_are_refused_elsewhere(key, control, tmp_path):
    case = load_case(key, tmp_path)
    extra = (case.candidate_args or ["--candidate-args", "--a-flag 1"]) if control == "candidate_args" \
        else [f"--{control}"]
    if not offers(key, control):
        with pytest.raises(ConfigError, match="^" + re.escape(refusal(key, control))):
            from_argv([*case.argv, *extra], {})
        return
    if control == "candidate_args" and not case.candidate_args:
        pytest.fail(f"target {key} offers --candidate-args: its case must give a value (Case.candidate_args)")
    _, plain = _plan(case)
    _, plan = _plan(case, *extra)
    names = [p.name for p in plan.candidates]
    if control == "diagnose":  # a speculation-only and a cache-only pool beside each (controls apart)
        gated = [p for p in plan.candidates if not is_control(p.name)]
        assert len(gated) == 3 * len([p for p in plain.candidates if not is_control(p.name)])
        assert {(p.engine.speculative, p.engine.radix_cache) for p in gated} == \
            {(True, True), (True, False), (False, True)}
    elif control == "calibrate":  # clean controls beside the candidates (harness/calibrate.py), never gated
        gated = [p.name for p in plain.candidates if not is_control(p.name)]  # a noisy target calibrates itself
        assert [n for n in names if not is_control(n)] == gated
        added = [p for p in plan.candidates if is_control(p.name)]
        assert added and all(p.engine.fault is None for p in added)
        for p in added:
            if p.name == BASELINE_POOL:  # the reference's flags, driven as a candidate
                assert not p.engine.speculative and not p.engine.radix_cache
    else:
        assert names == [p.name for p in plain.candidates]


@pytest.mark.parametrize("key", KEYS)
def test_replicas_run_what_the_dry_run_shows(key, tmp_path):
    case = load_case(key, tmp_path)
    target, plan = _plan(case)
    text = target.describe(plan)
    for pool in (*plan.candidates, plan.reference):
        assert f"pool {pool.name}" in text
        if not target.managed:
            assert pool.endpoints and all(u in text for u in pool.endpoints)
            continue
        for devices in target.dry_run_devices():  # --device auto: the GPU and the CPU profile
            launch = target.launch(pool, devices)
            assert shlex.join(launch.args) in text  # the dry run shows the flags the replicas get
            fn = launch.environment
            if fn is not None:  # it travels to the Ray actor by reference: a module-level function
                assert getattr(importlib.import_module(fn.__module__), fn.__name__) is fn


@pytest.mark.parametrize("key", KEYS)
def test_a_server_that_runs_what_its_pool_asked_passes_and_one_that_does_not_is_named(key, tmp_path):
    case = load_case(key, tmp_path)
    target, plan = _plan(case)
    pools = {p.name: p for p in (*plan.candidates, plan.reference)}
    for pool in pools.values():
        info = case.agreeing(pool, _launch(target, pool))
        assert target.check_reported(pool, _url(pool), info) is None, pool.name
    assert case.contradicting, f"target {key}: its case must give at least one contradicting report"
    for name, info, message in case.contradicting:
        problem = target.check_reported(pools[name], _url(pools[name]), info)
        assert problem is not None and message in problem, (name, problem)


@pytest.mark.parametrize("key", KEYS)
def test_a_candidate_reporting_another_interval_than_planned_is_named(key, tmp_path):
    """The interval check every target inherits: where the plan has an interval, the server must report it."""
    case = load_case(key, tmp_path)
    target, plan = _plan(case)
    pool = plan.candidates[0]
    if pool.engine.interval is None:  # learned from the server (vLLM): the plan takes the reported one
        pool = replace(pool, engine=replace(pool.engine, interval=64))
    info = dict(case.agreeing(pool, _launch(target, pool)), mamba_track_interval=pool.engine.interval * 2)
    problem = target.check_reported(pool, _url(pool), info)
    assert problem is not None and pool.name in problem or _url(pool) in problem
