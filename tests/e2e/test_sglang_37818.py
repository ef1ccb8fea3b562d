"""The upstream validation of SGLang PR #37818 on the real SGLang hybrid path: 0.5.19 as published FAILs the
gate with every turn that restored a checkpoint a verify step crossed flagged and nothing else; the same venv with
the fix (fix-pr37818.diff) PASSes, with drafts accepted, boundaries crossed inside verify steps and those
checkpoints restored.

Three servers of the trained tiny Qwen3-Next and its DFlash drafter (tests/sglang_setup/model/weights) on SGLang
0.5.19's CPU path (`make sglang SGLANG_VERSION=0.5.19 SGLANG_VENV=.venv-sglang-0.5.19`, the release's hybrid
patch set): the cold reference, shared by both variants, and a candidate per variant (DFLASH, B = 8, radix cache
with extra_buffer checkpoints every 128 tokens). benchmarks/sglang_37817.py gates each variant against the
shared reference (`--servers`) on the committed frozen suite's cases for I = 128 that the DESIGN table names
(a verify step from 1, 2, 6 and 8 tokens before a boundary and from one on it) and a shared-prefix case whose
second turn restores a checkpoint its first turn's prefill took (which the bug does not touch), and prints the
table; what is asserted comes from its summaries and from the servers' own verify trace (which step SGLang
tracked at each crossing: none unpatched, the right one patched). Fails instead of skipping under
SPECGATE_REQUIRE_SGLANG=1 (CI builds the venv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sglang_servers import servers_json, started, validation_servers
from protocol.hf_tokenizer import load_tokenizer
from tests.sglang_setup.model import DRAFTER_DIR, TARGET_DIR, WEIGHTS
from workloads.schema import dumps_jsonl
from workloads.validate import validate_file

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-sglang-0.5.19"
pytestmark = pytest.mark.slow
# offsets -1, -2, -6, -8 and 0 around boundary 128 (the DESIGN table's pre 255/254/250/248/256 at I = 128), and a
# 168-token prompt whose prefill takes a checkpoint at 128 that its second turn restores (run alone, without the
# group's stem, it shares nothing)
CASES = ("frozen-i128-k1-m1", "frozen-i128-k1-m2", "frozen-i128-k1-m6", "frozen-i128-k1-m8", "frozen-i128-k1-p0",
         "frozen-i128-shared-ckpt")


def _python() -> str:
    python = VENV / "bin" / "python"
    if not (VENV / ".installed").is_file():
        if os.environ.get("SPECGATE_REQUIRE_SGLANG") == "1":
            pytest.fail(f"SPECGATE_REQUIRE_SGLANG=1 but {VENV} is missing (.ci/run builds it: make sglang "
                        "SGLANG_VERSION=0.5.19 SGLANG_VENV=.venv-sglang-0.5.19 SGLANG_BASE=.venv-sglang)")
        pytest.skip("no .venv-sglang-0.5.19 (make sglang SGLANG_VERSION=0.5.19 SGLANG_VENV=.venv-sglang-0.5.19)")
    return str(python)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The reference and the two candidates, started together; their servers.json for the benchmark."""
    python, workdir = _python(), tmp_path_factory.mktemp("sglang-37818")
    ref, cands = validation_servers(python, TARGET_DIR, DRAFTER_DIR, [128], 8, workdir)
    with started([ref, *cands["unpatched"], *cands["patched"]]):
        print(f"healthy after {[s.startup_seconds for s in (ref, *cands['unpatched'], *cands['patched'])]}s")
        path = workdir / "servers.json"
        path.write_text(json.dumps(servers_json(ref, cands)))
        yield path, ref


def test_unpatched_fails_at_every_verify_crossed_restore_and_patched_passes(servers, tmp_path):
    path, _ = servers
    suite = tmp_path / "suite.jsonl"
    tok = load_tokenizer(str(TARGET_DIR))
    sessions = [s for s in validate_file(WEIGHTS / "frozen.jsonl", tokenizer=tok, max_context=None)
                if s.session_id in CASES]
    assert sorted(s.session_id for s in sessions) == sorted(CASES)
    suite.write_text(dumps_jsonl(sessions))
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sglang_37817.py"), "--servers", str(path),
                           "--suite", str(suite), "--load-requests", "0", "--runs-dir", str(tmp_path / "runs"),
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=2400)
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    assert proc.returncode == 0, "the table's verdicts are not FAIL (unpatched) and PASS (patched)"
    results = json.loads(out.read_text())
    u, p = results["unpatched"]["frozen"], results["patched"]["frozen"]
    assert (u["verdict"], p["verdict"]) == ("FAIL", "PASS")
    # unpatched: every turn that restored a checkpoint a verify step crossed is flagged, and nothing else
    assert len(u["verify_restores"]) == len(CASES) - 1
    assert u["flagged"] == u["verify_restores"]
    assert u["restores"]["prefill"] == [1, 0]  # restored, none flagged
    # the restore-window probe sees it at the restore itself: the prompt past the checkpoint already scores off
    assert u["windows"]["verify"][:2] == [len(CASES) - 1] * 2 and u["windows"]["prefill"][0] == 0
    # patched: the same turns restore the same checkpoints, now exact
    assert p["flagged"] == [] and p["verify_restores"] == u["verify_restores"]
    assert p["windows"]["verify"][:2] == [0, len(CASES) - 1] and p["windows"]["prefill"][:2] == [0, 1]
    # the servers' trace: SGLang 0.5.19 tracked no verify crossing; with the fix, each at the step it crossed
    for s, fixed in ((u, False), (p, True)):
        assert sum(n for *_, n, _ in s["cells"]) == len(s["verify_restores"]), "a crossing missing from the trace"
        for step, commit, tracked, n, flagged in s["cells"]:
            assert 0 <= step < commit <= 8
            assert tracked == (step if fixed else -1), (step, commit, tracked)
            assert flagged == (0 if fixed else n)
    # drafts really accepted: at least 2 per verify step through SGLang (its accept length counts one more)
    for s in (u, p):
        assert s["verify_steps"] > 0 and s["accepted_drafts"] / s["verify_steps"] >= 2.0, s
