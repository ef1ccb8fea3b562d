"""On the noisy bf16 engine, calibrated per code path, every registered fault is still caught where it acts.

The fp32 test's workload and notion of *affected* (tests/reports/test_fault_detection.py), on the bf16 engine
(`--dtype bfloat16`): the clean controls `ctl-i32-spec` and `ctl-i32-cache` are run as harness/calibrate.py
starts them (never a fault), the candidate is calibrated against them (harness.calibrate.per_path), judged with
its own tolerance, and drift that is path numerics is not counted (reports/render.judge). Acceptance: the clean
candidate is never flagged; with a fault at least 90% of the affected requests are flagged and nothing else.
"""

from __future__ import annotations

import pandas as pd
import pytest

from engine.engine import Engine
from harness.calibrate import per_path
from harness.config import RunConfig
from harness.targets.builtin import candidate_engine, control_engine, engine_config, reference_engine
from records.rundir import input_hash
from records.schema import build_record, candidate_key, reference_key
from reports.analyze import analyze
from reports.controls import path_numerics
from reports.gate import GateThresholds
from reports.render import judge
from reports.tree_shapes import request_shapes
from tests.reports.test_fault_detection import FAULT_PATHS, B, I, _answer, sessions

pytestmark = pytest.mark.slow


def _cfg(fault: str | None) -> RunConfig:
    return RunConfig(intervals=(I,), block_size=B, page_size=16, model_path="random", model_preset="tiny",
                     inject_fault=fault, cover=True, dtype="bfloat16")


def pool_records(cfg: RunConfig, name: str, spec, references: dict) -> list[dict]:
    """Every session on one fresh replica of `spec` (concurrency 1), references on the cold path (shared)."""
    engine = Engine(engine_config(cfg, spec))
    cold = references.setdefault("_engine", Engine(engine_config(cfg, reference_engine(cfg))))
    out = []
    for s in sessions():
        prev_in = prev_out = None
        for n, turn in enumerate(s.turns):
            ids = s.turn_input(n, prev_in, prev_out)
            h = input_hash(ids)
            common = dict(run_id="t", session=s, turn=n, input_ids=ids, input_hash=h, node_id=None,
                          max_new_tokens=turn.max_new_tokens, t_start=float(len(out)), retries=0, error=None,
                          tokenizer="byte")
            if h not in references:
                references[h] = build_record(key=reference_key(h), role="reference", pool="reference",
                                             engine=reference_engine(cfg).record(), concurrency=None,
                                             replica_id="ref-r0", gen=_answer(cold, "r", ids, turn.max_new_tokens),
                                             **common)
            gen = _answer(engine, f"{s.session_id}/{n}", ids, turn.max_new_tokens)
            out.append(build_record(key=candidate_key(name, 1, s.session_id, n), role="candidate", pool=name,
                                    engine=spec.record(), concurrency=1, replica_id=f"{name}-r0", gen=gen, **common))
            prev_in, prev_out = ids, gen.output_ids
    return out


@pytest.fixture(scope="module")
def runs() -> dict:
    """References and the clean controls, shared by every fault's run."""
    refs: dict = {}
    cfg = _cfg(None)
    controls = (pool_records(cfg, f"ctl-i{I}-spec", control_engine(cfg, I, True, False), refs)
                + pool_records(cfg, f"ctl-i{I}-cache", control_engine(cfg, I, False, True), refs))
    return {"refs": refs, "controls": controls}


def judged(fault: str | None, runs: dict) -> pd.DataFrame:
    """The candidate's requests as the calibrated gate judges them (path numerics reclassified)."""
    cfg = _cfg(fault)
    cands = pool_records(cfg, f"i{I}", candidate_engine(cfg, I), runs["refs"])
    refs = {h: r for h, r in runs["refs"].items() if h != "_engine"}
    records = cands + runs["controls"]
    gate = GateThresholds(min_coverage=0.0)
    base = analyze(records, refs)
    cals, uncalibrated = per_path(base, base[base["pool"].str.startswith("ctl-")], gate, False, False)
    assert not uncalibrated and cals[f"i{I}"].controls == (f"ctl-i{I}-spec", f"ctl-i{I}-cache")
    per_pool = {p: (c.margin_threshold, c.drift_tolerance) for p, c in cals.items()}
    df = analyze(records, refs, per_pool=per_pool)
    verdict, _ = judge(df, {r["key"]: r for r in records}, gate, True, per_pool)
    out = df[df["pool"] == f"i{I}"].copy()
    out.loc[path_numerics(out), "class"] = "path_numerics"
    shapes = request_shapes(cands)[["key", "shape"]].rename(columns={"shape": "tree_shape"})
    out = out.merge(shapes, on="key", how="left")
    out.attrs["verdict"], out.attrs["tolerance"] = verdict, cals[f"i{I}"].drift_tolerance
    return out


def test_the_clean_bf16_candidate_passes_with_its_calibrated_tolerance(runs):
    df = judged(None, runs)
    assert set(df["class"]) <= {"exact", "path_numerics"}, df.loc[df["class"] != "exact", ["key", "class", "drift"]]
    assert df.attrs["verdict"].word == "PASS", df.attrs["verdict"].unexercised


@pytest.mark.parametrize("fault", sorted(FAULT_PATHS))
def test_fault_is_flagged_where_it_acts_in_bf16(fault, runs):
    path = FAULT_PATHS[fault]
    df = judged(fault, runs)
    rows = df.to_dict("records")
    by_turn = {(r["session_id"], r["turn"]): r for r in rows}
    for r in rows:
        prev = by_turn.get((r["session_id"], r["turn"] - 1))
        while prev is not None and prev["turn"] > 0 and prev["cached_tokens"] == r["cached_tokens"]:
            prev = by_turn.get((r["session_id"], prev["turn"] - 1))
        r["prev_input_len"] = prev["input_len"] if prev is not None else 0
    affected = {r["key"] for r in rows if path.affected(r)}
    flagged = {r["key"] for r in rows if r["class"] in ("drift", "hard")}
    assert len(affected) >= path.reach
    assert flagged <= affected, sorted(flagged - affected)
    assert len(flagged) >= 0.9 * len(affected), (len(flagged), len(affected), df.attrs["tolerance"])
