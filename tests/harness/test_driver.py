"""The driver against in-process fake servers, no Ray: affinity, turn building, dedupe, fail-over, resume."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from harness.backends import RequestError
from harness.driver import Driver
from harness.progress import Progress
from harness.targets import run_config
from harness.targets.builtin import candidate_engine, reference_engine
from records.jsonl import RecordFiles, load_run
from records.rundir import input_hash
from tests.harness.fake_server import fake_tokens
from tests.harness.helpers import (
    SUFFIX,
    candidate_args,
    duplicate_keys,
    expected_candidate_keys,
    fake_servers,
    journal_lines,
    make_sessions,
    pool,
    read_lines,
    reference_args,
)

INTERVAL = 16
CFG = run_config(intervals=(INTERVAL,), block_size=4)


def drive(run_dir: Path, sessions, cand_urls, ref_urls, concurrency=(1, 2), existing=None, existing_refs=None,
          recover: float = 1.0, **kw) -> Progress:
    """Run a Driver over external-style pools of the given URLs; return its counters."""
    async def go() -> Progress:
        key = kw.get("api_key")  # the pools' backend sends it
        cands = [pool(f"i{INTERVAL}", cand_urls, candidate_engine(CFG, INTERVAL), recover=recover, api_key=key)]
        ref = pool("reference", ref_urls, reference_engine(CFG), role="reference", recover=recover, api_key=key)
        progress = Progress(0, 0, enabled=False)
        files = RecordFiles(run_dir, set(existing or {}) | {f"ref/{h}" for h in existing_refs or {}})
        async with aiohttp.ClientSession() as http:
            d = Driver(run_id="t", concurrency=concurrency, candidates=cands, reference=ref, files=files,
                       http=http, progress=progress, existing=existing, existing_refs=existing_refs,
                       request_timeout=10, max_retries=2, **kw)
            await d.run({cands[0].name: tuple(sessions)})
        files.close()
        return progress

    return asyncio.run(go())


def with_servers(tmp_path: Path, n_cand: int, fn, cand_extra=(), ref_extra=()):
    """Call fn(cand_urls, ref_urls) with fake servers (rid logs in tmp_path) running."""
    async def go():
        argvs = [candidate_args(INTERVAL, "--rid-log", str(tmp_path / f"cand{k}.rids"), *cand_extra)
                 for k in range(n_cand)]
        async with fake_servers(*argvs, reference_args("--rid-log", str(tmp_path / "ref.rids"), *ref_extra)) as u:
            return await asyncio.to_thread(fn, u[:n_cand], u[n_cand:])

    return asyncio.run(go())


def test_affinity_turn_building_and_reference_dedupe(tmp_path):
    sessions = make_sessions(6)
    run_dir = tmp_path / "run"
    progress = with_servers(tmp_path, 2, lambda c, r: drive(run_dir, sessions, c, r))
    recs = read_lines(run_dir)
    cands = [r for r in recs if r["role"] == "candidate"]
    refs = [r for r in recs if r["role"] == "reference"]
    assert not duplicate_keys(recs)
    assert {r["key"] for r in cands} == expected_candidate_keys(sessions, (INTERVAL,), (1, 2))
    assert progress.errors == 0 and progress.mismatches == 0 and progress.retries == 0
    by = {(r["concurrency"], r["session_id"], r["turn"]): r for r in cands}
    for c in (1, 2):
        used = set()
        for s in sessions:
            t0, t1 = by[(c, s.session_id, 0)], by[(c, s.session_id, 1)]
            assert t0["replica_id"] == t1["replica_id"]  # the session's cache lives on one replica
            used.add(t0["replica_id"])
            assert t0["input_ids"] == list(s.turns[0].input_ids)
            assert t0["output_ids"] == fake_tokens(t0["input_ids"], 8, False)
            assert t1["input_ids"] == t0["input_ids"] + t0["output_ids"] + list(SUFFIX)
            assert t0["cached_tokens"] == 0  # caches were flushed between sweep points
            assert t1["cached_tokens"] == (20 + 8) // INTERVAL * INTERVAL
            assert t0["ttft"] is not None and t0["itl"] is not None and t0["e2e"] >= t0["ttft"]
            assert t0["spec_verify_ct"] and t0["spec_trace"] and t0["engine"]["interval"] == INTERVAL
        assert used == {f"i{INTERVAL}-r0", f"i{INTERVAL}-r1"}
    # one reference per distinct input, for the whole run (both sweep points share them)
    hashes = {r["input_hash"] for r in cands}
    assert len(hashes) == 12 and sorted(r["input_hash"] for r in refs) == sorted(hashes)
    ref_rids = (tmp_path / "ref.rids").read_text().splitlines()
    assert len([x for x in ref_rids if not x.endswith("/window-ref")]) == 12
    # each restored turn's window probe: to its own replica, then to the reference (harness/window.py), there
    # once per input and checkpoint: both sweep points' turns restore the same ones
    restored = [r for r in cands if r["cached_tokens"] > 0]
    windows = {(r["input_hash"], r["window_start"]) for r in restored}
    by_key = {r["key"]: r for r in restored}
    sent = [by_key[x.removeprefix("t:").removesuffix("/window-ref")] for x in ref_rids if x.endswith("/window-ref")]
    assert len(restored) == 2 * len(windows) == 12 and sorted((r["input_hash"], r["window_start"]) for r in sent) \
        == sorted(windows)
    for r in restored:
        assert (r["window_start"], r["window_cached_tokens"]) == (r["cached_tokens"], r["cached_tokens"])
        assert r["window_logprobs"] == r["window_ref_logprobs"] == [-0.05] * (r["input_len"] - r["cached_tokens"] - 1)
        replica = r["replica_id"][-1]
        assert f"t:{r['key']}/window" in (tmp_path / f"cand{replica}.rids").read_text().split()
    assert all("window_start" not in r for r in cands if r["cached_tokens"] == 0)
    for r in refs:
        assert r["key"] == f"ref/{r['input_hash']}" and r["input_hash"] == input_hash(r["input_ids"])
        assert r["concurrency"] is None and r["interval"] is None and r["ttft"] is None
        assert len(r["output_top_logprobs"][0]) == 2 and r["engine"]["radix_cache"] is False


def test_fault_shows_as_live_mismatches(tmp_path):
    sessions = make_sessions(3)
    progress = with_servers(tmp_path, 1, lambda c, r: drive(tmp_path / "run", sessions, c, r),
                            cand_extra=("--inject-fault", "stale-seq-lens"))
    # turn 1 hits the cache on the candidate, which the fault corrupts; turn 0 is clean
    assert progress.mismatches == 3 * 2 and progress.errors == 0


def test_unreachable_replica_is_avoided(tmp_path):
    sessions = make_sessions(4)
    dead = "http://127.0.0.1:9"  # discard port: connection refused
    run_dir = tmp_path / "run"
    progress = with_servers(tmp_path, 1, lambda c, r: drive(run_dir, sessions, [dead, c[0]], r, recover=0.5))
    cands = [r for r in read_lines(run_dir) if r["role"] == "candidate"]
    assert {r["key"] for r in cands} == expected_candidate_keys(sessions, (INTERVAL,), (1, 2))
    assert all(r["error"] is None and r["replica_id"] == f"i{INTERVAL}-r1" for r in cands)
    assert progress.errors == 0


def test_failed_requests_are_resent_and_counted(tmp_path):
    sessions = make_sessions(4)
    run_dir = tmp_path / "run"
    progress = with_servers(tmp_path, 2, lambda c, r: drive(run_dir, sessions, c, r), cand_extra=("--fail-first", "1"))
    cands = [r for r in read_lines(run_dir) if r["role"] == "candidate"]
    assert {r["key"] for r in cands} == expected_candidate_keys(sessions, (INTERVAL,), (1, 2))
    assert all(r["error"] is None for r in cands) and not duplicate_keys(cands)
    # each replica fails its first request once; those two requests were re-sent
    assert progress.retries == 2 and sum(r["retries"] for r in cands) == 2
    rids = [x for k in range(2) for x in (tmp_path / f"cand{k}.rids").read_text().split()]
    probes = [x for x in rids if x.endswith("/window")]  # one per restored turn (harness/window.py)
    assert len(probes) == sum(r["cached_tokens"] > 0 for r in cands) > 0
    assert sum("#retry" in x for x in rids) == 2 and len(rids) - len(probes) == 16 + 2


def test_pool_without_replicas_records_errors_and_skips_later_turns(tmp_path):
    sessions = make_sessions(2)
    run_dir = tmp_path / "run"
    progress = with_servers(tmp_path, 0, lambda c, r: drive(run_dir, sessions, ["http://127.0.0.1:9"], r,
                                                             concurrency=(1,), recover=0.3))
    cands = {r["key"]: r for r in read_lines(run_dir) if r["role"] == "candidate"}
    assert set(cands) == expected_candidate_keys(sessions, (INTERVAL,), (1,)) and progress.errors == 4
    assert "no healthy replica" in cands[f"i{INTERVAL}-c1/s0/0"]["error"]
    assert cands[f"i{INTERVAL}-c1/s0/1"]["error"] == "not run: turn 0 of the session failed"


def test_resume_sends_nothing_twice_and_rebuilds_from_recorded_output(tmp_path):
    sessions = make_sessions(4)
    full = tmp_path / "full"
    (tmp_path / "a").mkdir()
    with_servers(tmp_path / "a", 1, lambda c, r: drive(full, sessions, c, r))
    full_keys = {r["key"] for r in read_lines(full)}
    # an interrupted run: a few records survived, one half-written line at the end
    part = tmp_path / "part"
    (part / "records").mkdir(parents=True)
    cand_lines = journal_lines(full, f"candidate-i{INTERVAL}")
    kept = [json.loads(x) for x in cand_lines if json.loads(x)["turn"] == 0][:2]
    kept[0]["output_ids"] = [65, 66, 67]  # the turn-1 input must be built from what was recorded
    (part / "records" / f"candidate-i{INTERVAL}.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in kept) + cand_lines[5][:40])
    ref_lines = journal_lines(full, "reference")
    (part / "records" / "reference.jsonl").write_text(ref_lines[0] + "\n")
    recorded = load_run(part)
    existing, existing_refs = recorded.candidates_by_key(), recorded.references
    (tmp_path / "b").mkdir()
    with_servers(tmp_path / "b", 1, lambda c, r: drive(part, sessions, c, r, existing=existing,
                                                       existing_refs=existing_refs))
    recs = read_lines(part)
    assert not duplicate_keys(recs) and {r["key"] for r in recs} == full_keys | {
        f"ref/{input_hash([*kept[0]['input_ids'], 65, 66, 67, *SUFFIX])}"}
    sent = (tmp_path / "b" / "cand0.rids").read_text().split() + (tmp_path / "b" / "ref.rids").read_text().split()
    sent_keys = [rid.split(":", 1)[1] for rid in sent]
    assert len(sent_keys) == len(set(sent_keys))
    assert not set(sent_keys) & ({r["key"] for r in kept} | {json.loads(ref_lines[0])["key"]})
    turn1 = next(r for r in recs if r["key"] == kept[0]["key"][:-1] + "1")
    assert turn1["input_ids"] == kept[0]["input_ids"] + [65, 66, 67] + list(SUFFIX)
    # the cache counters of a resumed sweep point cover only what this process sent, and say so
    partial = {s["concurrency"]: s["partial"] for s in load_run(part).stats}
    assert partial == {kept[0]["concurrency"]: True, 3 - kept[0]["concurrency"]: False}


def test_api_key_is_sent(tmp_path):
    """The run's key reaches every endpoint; without it the first /flush_cache (before any request) is refused at
    once, with a hint about the key, instead of being retried as if requests were running."""
    sessions = make_sessions(1, turns=1)
    ok = with_servers(tmp_path, 1, lambda c, r: drive(tmp_path / "ok", sessions, c, r, concurrency=(1,),
                                                      api_key="k"), ("--api-key", "k"), ("--api-key", "k"))
    assert ok.errors == 0 and ok.done == 1
    with pytest.raises(RequestError) as err:
        with_servers(tmp_path, 1, lambda c, r: drive(tmp_path / "bad", sessions, c, r, concurrency=(1,)),
                     ("--api-key", "k"), ("--api-key", "k"))
    assert str(err.value).startswith("POST http://127.0.0.1:")
    assert str(err.value).endswith('/flush_cache refused (HTTP 401: {"error":"Unauthorized"}); it was sent with no '
                                   "API key: pass the server's key with --api-key (SGLang's /flush_cache takes its "
                                   "--api-key or --admin-api-key)")
    assert not [r for r in read_lines(tmp_path / "bad") if r["role"] == "candidate"]  # nothing was sent


def test_cache_counters_per_sweep_point_and_replica(tmp_path):
    """A stats record per sweep point and replica: /metrics differences; unexposed counters are None."""
    sessions = make_sessions(4)
    run_dir = tmp_path / "run"
    with_servers(tmp_path, 2, lambda c, r: drive(run_dir, sessions, c, r), cand_extra=("--metrics",))
    run = load_run(run_dir)
    assert sorted(s["key"] for s in run.stats) == [f"stats/i{INTERVAL}-c{c}/i{INTERVAL}-r{k}"
                                                   for c in (1, 2) for k in (0, 1)]
    for s in run.stats:
        served = sum(r["cached_tokens"] for r in run.candidates
                     if r["concurrency"] == s["concurrency"] and r["replica_id"] == s["replica_id"])
        assert served > 0
        assert s["counters"] == {"cache_hit_tokens": served, "checkpoint_evictions": None, "kv_evicted_pages": None}
        assert s["partial"] is False and s["t_end"] >= s["t_start"]


def test_cache_counters_are_unknown_without_metrics(tmp_path):
    sessions = make_sessions(2)
    run_dir = tmp_path / "run"
    with_servers(tmp_path, 1, lambda c, r: drive(run_dir, sessions, c, r, concurrency=(1,)))
    (stats,) = load_run(run_dir).stats
    assert stats["counters"] == {"cache_hit_tokens": None, "checkpoint_evictions": None, "kv_evicted_pages": None}
