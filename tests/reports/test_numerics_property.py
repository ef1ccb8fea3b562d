"""The invariant of the classifier and the gate together, over synthetic pools: INCONCLUSIVE is never a place for
evidence of a bug. Any pool with a token flip whose reference margin exceeds SWAP_FACTOR x every drift its turns
showed before their flips, its controls showed, and its tolerance, yields FAIL: whatever the pool restored, whether
a control shares its path, whether the run is calibrated, whatever the flip's own top-k did."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports.analyze import analyze
from reports.facts import TokenFacts
from reports.gate import GateThresholds
from reports.numerics import SWAP_FACTOR
from reports.render import judge
from tests.reports.factory import pair, prompt

OUT_LEN = 6
# pool kinds: vLLM's speculation-only pool (restores nothing, only the baseline control), a full candidate with
# its path controls, the fp32 built-in engine (not calibrated: the run's tolerance)
KINDS = {"unshared": ("vllm", None, ("baseline",)), "full": ("i128", 128, ("ctl-i128-spec", "ctl-i128-cache")),
         "fp32": ("i128", 128, None)}

drifts = st.floats(0.0, 1.5, allow_nan=False)
turn = st.fixed_dictionaries({
    "flip": st.one_of(st.none(), st.integers(0, OUT_LEN - 1)),  # the output index of the flip, None: same tokens
    "drift": st.lists(st.one_of(st.just(0.0), drifts), min_size=OUT_LEN, max_size=OUT_LEN),  # per position
    "margin": st.floats(0.0, 4.0, allow_nan=False),  # the reference's top-1/top-2 margin at the flip
    "at_flip": st.sampled_from(["shared", "disjoint", "moved"]),  # the candidate's top-2 at the flip
    "restored": st.booleans(),
})
pool = st.fixed_dictionaries({
    "kind": st.sampled_from(sorted(KINDS)),
    "turns": st.lists(turn, min_size=1, max_size=5),
    "control_drift": st.one_of(st.just(0.0), st.floats(0.0, 0.3, allow_nan=False)),
    "control_flip": st.one_of(st.none(), st.floats(0.0, 0.5, allow_nan=False)),
})


def _records(p: dict) -> tuple[list[dict], dict]:
    name, interval, _ = KINDS[p["kind"]]
    recs = []
    out = [100 + j for j in range(OUT_LEN)]
    for s, t in enumerate(p["turns"]):
        flip = t["flip"]
        cand_out = list(out) if flip is None else out[:flip] + [40] + out[flip + 1:]
        c, ref = pair(prompt(50 + s, seed=s), cand_out, out, margins={} if flip is None else {flip: t["margin"]},
                      pool=name, interval=interval, session_id=f"s{s}", turn=1 if t["restored"] else 0,
                      cached_tokens=(interval or 0) if t["restored"] and p["kind"] != "unshared" else 0,
                      spec_trace=None)
        c["engine"]["radix_cache"] = p["kind"] != "unshared"
        shown = OUT_LEN if flip is None else flip
        c["output_logprobs"] = [-0.25 - t["drift"][i] if i < shown else lp for i, lp in enumerate(c["output_logprobs"])]
        if flip is not None and t["at_flip"] == "disjoint":
            c["output_top_logprobs"][flip] = [[-0.1, 40], [-0.9, 90]]
        elif flip is not None and t["at_flip"] == "moved":  # the flip's own top-k moved far: a wrong state's sign
            c["output_top_logprobs"][flip] = [[-0.1, 40], [-0.25 - t["margin"] - 3.0, out[flip]]]
        recs += [c, ref]
    return recs, {"drift_max": p["control_drift"], "flip_margin_max": p["control_flip"]}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=pool)
def test_a_flip_beyond_every_measured_drift_fails_the_gate(p):
    recs, cal = _records(p)
    name, _, controls = KINDS[p["kind"]]
    calibrated = controls is not None
    tolerance = max(1e-4, 4 * cal["drift_max"]) if calibrated else GateThresholds().drift_tolerance
    cands = [r for r in recs if r["role"] == "candidate"]
    refs = {r["input_hash"]: r for r in recs if r["role"] == "reference"}
    per_pool = {name: (0.5, tolerance)} if calibrated else None
    df = analyze(cands, refs, per_pool=per_pool)
    calibration = {name: {**cal, "controls": list(controls)}} if calibrated else None
    verdict, _, judged = judge(df, TokenFacts.of({r["key"]: r for r in cands}, refs),
                               GateThresholds(min_coverage=0.0), calibrated, per_pool, calibration=calibration)
    # every drift the pool showed before its flips (restored or not), its controls', its tolerance
    shown = [d for t in p["turns"] for i, d in enumerate(t["drift"]) if t["flip"] is None or i < t["flip"]]
    reach = max([*shown, cal["drift_max"], cal["flip_margin_max"] or 0.0, tolerance])
    flips = df[df["first_divergence"].notna()]
    if (flips["ref_margin"] > SWAP_FACTOR * reach).any():
        assert verdict.word == "FAIL" and verdict.hard >= int((flips["ref_margin"] > SWAP_FACTOR * reach).sum())
        assert not judged.loc[flips.index[flips["ref_margin"] > SWAP_FACTOR * reach], "class"].isin(
            ["soft", "path_numerics"]).any()
    if verdict.word == "INCONCLUSIVE":  # no evidence either way: nothing flagged, no flip beyond the path's reach
        assert verdict.hard == verdict.drift == 0
        assert not (flips["ref_margin"] > SWAP_FACTOR * reach).any()
