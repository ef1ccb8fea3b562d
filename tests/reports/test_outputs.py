"""The rendered run: python -m reports.render exit codes, junit.xml, report.html, summary.md, plots."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

from reports.analyze import analyze, empty_frame
from reports.plots import PLOT_FILES, write_plots
from reports.tables import boundaries_table, configs_table
from tests.reports.factory import candidate, pair, prompt, reference, synthetic_run, write_run

ROOT = Path(__file__).resolve().parents[2]
XSS = "<script>alert(1)</script>"


def render_cli(run_dir: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reports.render", str(run_dir), *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def fault_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """#37817 modelled: 4 hard (one per sweep point), 4 soft, plus one failed request with a hostile message."""
    run_dir = synthetic_run(tmp_path_factory.mktemp("fault"), fault=True, soft_sessions=1)
    write_run(run_dir, [candidate(prompt(40), [], pool="i256", session_id="broken", error=f"HTTP 500 {XSS}")])
    return run_dir, render_cli(run_dir)


def test_cli_fails_the_gate_with_exit_1(fault_run):
    run_dir, proc = fault_run
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "FAIL: 4 hard mismatches, 0 drift (4/33 requests), 1 error, 4 soft (12.1%)"
    assert lines[-1] == f"report: {run_dir / 'report.html'}"
    for name in ("requests.csv", "boundaries.csv", "configs.csv", "report.html", "summary.md", "junit.xml"):
        assert (run_dir / name).is_file(), name
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == sorted(PLOT_FILES.values())


def test_cli_passes_with_exit_0_and_threshold_flags(tmp_path):
    run_dir = synthetic_run(tmp_path / "clean", fault=False, intervals=(256,), concurrencies=(1,), soft_sessions=1)
    proc = render_cli(run_dir, "--max-soft-rate", "0.2", "--min-coverage", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "PASS: 0 hard mismatches, 0 drift (0/8 requests), 0 errors, 1 soft (12.5%)"
    # the same records under the default --min-coverage: 1 of 36 cells restored is not evidence enough
    proc = render_cli(run_dir, "--max-soft-rate", "0.2")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.splitlines()[:2] == [
        "INCONCLUSIVE: 0 hard mismatches, 0 drift (0/8 requests), 0 errors, 1 soft (12.5%)",
        "  - pool i256: 1 of the 36 (verify step, commit length) boundary cells of B=8 were crossed and restored "
        "(3% < --min-coverage 0.15); use the default frozen suite at more concurrencies, --cover (a scripted drafter "
        "that walks every cell), or lower --min-coverage"]
    assert "not exercised: pool i256: 1 of the 36" in (run_dir / "summary.md").read_text().split("**Diagnosis")[0]
    assert '<header class="verdict inconclusive">' in (run_dir / "report.html").read_text()


def test_cli_exits_2_without_records(tmp_path):
    (tmp_path / "records").mkdir()
    proc = render_cli(tmp_path)
    assert proc.returncode == 2
    assert "no candidate records" in proc.stderr
    assert not (tmp_path / "report.html").exists()


def test_boundaries_show_the_restored_verify_signature(fault_run):
    run_dir, _ = fault_run
    b = pd.read_csv(run_dir / "boundaries.csv")
    rv = b[b["boundary_kind"] == "restored_verify"]
    # turn 0 prompt I-3, prefill's token makes it I-2, verify commits 3: boundary I is step 1 of commit 3
    assert rv[["interval", "offset", "commit_len", "requests", "hard", "untracked"]].values.tolist() == [
        [128, 1, 3, 2, 2, 2], [256, 1, 3, 2, 2, 2]]
    req = pd.read_csv(run_dir / "requests.csv")
    hard = req[req["class"] == "hard"]
    assert set(hard["key"]) == set(req[req["restored_verify_crossed"]]["key"])


def test_junit_has_one_testcase_per_request_and_counts_as_the_verdict_does(fault_run):
    """33 requests: failures = the verdict's 4 flagged (hard) requests, errors = its 1 failed request, soft flips
    pass; the run's own testcase passes, since the request testcases already fail the run."""
    run_dir, _ = fault_run
    root = ET.parse(run_dir / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 34  # 33 requests + the run
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("34", "4", "1")
    suites = {s.get("name"): (s.get("tests"), s.get("failures"), s.get("errors")) for s in root.findall("testsuite")}
    assert suites == {"i128.c1": ("8", "1", "0"), "i128.c4": ("8", "1", "0"), "i256.c1": ("9", "1", "1"),
                      "i256.c4": ("8", "1", "0"), "specgate": ("1", "0", "0")}
    failed = {(c.get("classname"), c.get("name")): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failed) == {("i128.c1", "frozen-i128-0/1"), ("i128.c4", "frozen-i128-0/1"),
                           ("i256.c1", "frozen-i256-0/1"), ("i256.c4", "frozen-i256-0/1")}
    hard = failed[("i256.c1", "frozen-i256-0/1")]
    assert hard.get("type") == "hard"
    assert "output index 0" in hard.get("message") and "restored checkpoint at 256" in hard.get("message")
    assert "verify step 1 of commit 3 (NOT tracked)" in hard.get("message")
    errored = [c for c in cases if c.find("error") is not None]
    assert [(c.get("classname"), c.get("name")) for c in errored] == [("i256.c1", "broken/0")]
    soft = [c for c in cases if c.get("name").startswith("frozen-i256-3/") and c.get("classname") == "i256.c1"]
    assert soft and all(c.find("failure") is None for c in soft)
    run = [c for c in cases if c.get("classname") == "specgate"][0]
    assert run.find("failure") is None and run.find("system-out").text.startswith("FAIL: 4 hard mismatches")


def test_junit_fails_the_run_testcase_where_no_request_carries_the_failure(tmp_path):
    """A gate failed by the soft-flip rate alone: no request's testcase fails, the run's does, with the reasons."""
    run_dir = synthetic_run(tmp_path / "run", fault=False, soft_sessions=1)
    proc = render_cli(run_dir, "--max-soft-rate", "0")
    assert proc.returncode == 1 and proc.stdout.startswith("FAIL: 0 hard mismatches, 0 drift"), proc.stdout
    root = ET.parse(run_dir / "junit.xml").getroot()
    assert (root.get("failures"), root.get("errors")) == ("1", "0")
    run = [c for c in root.iter("testcase") if c.get("classname") == "specgate"][0]
    assert run.find("failure").get("type") == "FAIL" and "soft" in run.find("failure").text


def test_html_is_self_contained_verdict_first_and_escaped(fault_run):
    run_dir, _ = fault_run
    page = (run_dir / "report.html").read_text()
    assert 'src="http' not in page and "<link" not in page and "<script" not in page
    assert page.count('src="data:image/png;base64,') == len(PLOT_FILES)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    verdict = page.index('class="word">FAIL<')
    assert verdict < page.index("<h2 id=boundaries>") < page.index("<h2 id=plots>") < page.index("<h2 id=cases>")
    first_hard, first_soft = page.index('class="case hard"'), page.index('class="case soft"')
    assert first_hard < first_soft < page.index('class="case error"')
    assert 'class="first">200<' in page  # the candidate's first divergent token id is highlighted


def test_summary_has_the_verdict(fault_run):
    run_dir, _ = fault_run
    text = (run_dir / "summary.md").read_text()
    assert text.splitlines()[2] == "**FAIL: 4 hard mismatches, 0 drift (4/33 requests), 1 error, 4 soft (12.1%)**"
    assert "of which flagged (hard or drift): 4" in text


def test_plots_render_with_zero_mismatches_and_no_spec_data(tmp_path):
    records = []
    for s in range(3):
        records += pair(prompt(250 + s, s), [65 + s] * 6, session_id=f"s{s}", accept=None, ttft=None, itl=None,
                        e2e=None, spec_verify_ct=None)
    cands = [r for r in records if r["role"] == "candidate"]
    df = analyze(cands, {r["input_hash"]: r for r in records if r["role"] == "reference"})
    assert set(df["class"]) == {"exact"} and df["spec_accept_length"].isna().all()
    paths = write_plots(df, boundaries_table(df), configs_table(df), tmp_path / "plots")
    assert all(p.stat().st_size > 1000 for p in paths.values())
    empty = empty_frame()
    paths = write_plots(empty, boundaries_table(empty), configs_table(empty), tmp_path / "empty")
    assert sorted(p.name for p in paths.values()) == sorted(PLOT_FILES.values())


def test_diagnosis_comes_first_and_the_drift_floor_has_its_section(fault_run):
    run_dir, _ = fault_run
    page = (run_dir / "report.html").read_text()
    # the verdict, then where the flagged requests are with the diagnosis' headline, the key figures, the diagnosis
    where = page.index('class="where"')
    assert page.index('class="verdict fail"') < where < page.index('class="figures"') < page.index('class="diag"')
    assert "The evidence points at the restored checkpoints" in page[where:page.index('class="figures"')]
    assert page.index("<h2 id=floor>") < page.index("<h2 id=boundaries>")
    assert "Boundary-case coverage" in page and "Cache pressure: checkpoint evictions: unknown" in page
    assert (run_dir / "coverage.csv").is_file()


def test_drift_is_a_junit_failure_and_a_worst_case(tmp_path):
    from reports.junit import junit_tree
    from tests.reports.test_oracle import drifted

    p = prompt(300)
    cand, ref = drifted(candidate(p, [65] * 8, session_id="d", turn=1, cached_tokens=256), {0: 0.7}), \
        reference(p, [65] * 8)
    write_run(tmp_path, [cand, ref])
    proc = render_cli(tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[0] == "FAIL: 0 hard mismatches, 1 drift (1/1 requests), 0 errors, 0 soft (0.0%)"
    df = pd.read_csv(tmp_path / "requests.csv")
    assert (df.loc[0, "class"], df.loc[0, "onset_points_at"]) == ("drift", "restored_checkpoint")
    root = junit_tree(analyze([cand], {ref["input_hash"]: ref})).getroot()
    failure = root.find(".//failure")
    assert failure.get("type") == "drift" and "log-prob drift 0.7, from output index 0" in failure.get("message")
    page = (tmp_path / "report.html").read_text()
    assert 'class="case drift"' in page and "points at the restored checkpoint" in page


def test_tree_shapes_are_written_and_shown_beside_the_cells(tmp_path):
    """tree_shapes.csv from the records' ids; the page's coverage section shows it and warns where a designed shape
    was not reached (turn 3 sent before turn 2 finished: designed `split`, reached `deeper`)."""
    from tests.reports.test_tree_shapes import DESIGN, O0, O1, O2, SEQ1, X2, X3, P

    turns = [(P, O0, 0, 0.0), (SEQ1, O1, 32, 2.0), (SEQ1[:52] + X2, O2, 32, 4.0), (SEQ1[:52] + X3, O2, 32, 4.5)]
    records = [r for n, (ids, out, cached, t) in enumerate(turns)
               for r in pair(ids, out, session_id="fan", turn=n, cached_tokens=cached, t_start=t, e2e=1.0,
                             case={"tree_shapes": DESIGN["fan"]})]
    run_dir = write_run(tmp_path / "run", records)
    assert render_cli(run_dir).returncode == 3  # INCONCLUSIVE: these turns decode across no boundary
    shapes = pd.read_csv(run_dir / "tree_shapes.csv")
    got = {r["shape"]: (r["requests"], r["designed"], r["designed_reached"]) for r in shapes.to_dict("records")}
    assert got == {"checkpoint": (1, 1, 1), "split": (0, 1, 0), "deeper": (2, 1, 1), "sibling": (0, 0, 0)}
    page = (run_dir / "report.html").read_text()
    assert page.index("<h2 id=coverage>") < page.index("<h3>Tree shapes") < page.index("<h2 id=sweep>")
    assert "interval 256: 1 of 1 requests designed to reach <code>split</code> did not" in page
    summary = (run_dir / "summary.md").read_text()
    assert "Tree shapes at interval 256 (restored requests, flagged): checkpoint 1 (0), split 0 (0), deeper 2 (0)" \
        in summary


def test_junit_names_open_loop_points_by_their_rate_from_the_key():
    from reports.junit import sweep_point

    assert sweep_point("i128", None, "i128-r2.5/s/0") == "i128.r2.5"  # open loop: concurrency None
    assert sweep_point("i128", 4, "i128-c4/s/0") == "i128.c4" and sweep_point("i128", 4) == "i128.c4"
    assert sweep_point("i128", None) == "i128"
