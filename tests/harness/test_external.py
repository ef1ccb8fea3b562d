"""External endpoints (`--endpoint`, `--reference-endpoint`): pools from /server_info, the capability probe."""

from __future__ import annotations

import contextlib

import pytest

from harness.run import main
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness.helpers import (
    FAKE_SERVER,
    candidate_args,
    check_complete,
    make_sessions,
    reference_args,
    server_processes,
    write_workload,
)

pytestmark = pytest.mark.slow


@contextlib.contextmanager
def servers(*argvs: list[str]):
    """Fake servers as subprocesses on free ports; yields their URLs once healthy."""
    with server_processes(FAKE_SERVER, argvs, "fake servers") as urls:
        yield urls


def test_external_endpoints_grouped_by_interval(tmp_path):
    sessions = make_sessions(4)
    workload = write_workload(tmp_path / "w.jsonl", sessions)
    with servers(candidate_args(16), candidate_args(32), candidate_args(32), reference_args()) as (a, b, c, r):
        rc = main(["--suite", str(workload), "--endpoint", a, "--endpoint", b, "--endpoint", c,
                   "--reference-endpoint", r, "--concurrency", "1,2", "--runs-dir", str(tmp_path / "runs"),
                   "--run-id", "ext", "--no-progress"])
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert rc == EXIT_INCONCLUSIVE
    cands = check_complete(tmp_path / "runs" / "ext", sessions)
    assert {r["engine"]["endpoint"] for r in cands if r["pool"] == "i32"} == {b, c}
    assert {r["engine"]["endpoint"] for r in cands if r["pool"] == "i16"} == {a}
    assert all(r["node_id"] is None and r["tokenizer"] == "byte" and r["engine"]["block_size"] == 4
               for r in cands)


@pytest.mark.parametrize("cand_extra, ref_extra, message", [
    ((), ("--top-k-max", "1"), "output_top_logprobs has 1 entries per token; specgate needs >= 2"),
    ((), ("--top-k-max", "0"), "output_top_logprobs has 0 entries"),
    (("--api-key", "k"), (), "/server_info is not reachable (HTTP 401"),
])
def test_capability_probe_fails_fast(tmp_path, capsys, cand_extra, ref_extra, message):
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(1))
    with servers(candidate_args(16, *cand_extra), reference_args(*ref_extra)) as (a, r):
        rc = main(["--suite", str(workload), "--endpoint", a, "--reference-endpoint", r,
                   "--runs-dir", str(tmp_path / "runs"), "--no-progress"])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_candidate_endpoint_must_speculate(tmp_path, capsys):
    workload = write_workload(tmp_path / "w.jsonl", make_sessions(1))
    with servers(reference_args(), reference_args()) as (a, r):
        rc = main(["--suite", str(workload), "--endpoint", a, "--reference-endpoint", r, "--dry-run"])
    assert rc == 2 and "a candidate must run speculative decoding with the radix cache" in capsys.readouterr().err
