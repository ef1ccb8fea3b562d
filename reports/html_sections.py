"""The sections of report.html above the worst cases, one function each, in page order."""

from __future__ import annotations

import pandas as pd

from records.schema import CACHE_COUNTERS
from reports.controls import is_control
from reports.coverage import coverage_summary
from reports.diagnosis import Diagnosis, NoiseFloor
from reports.gate import Verdict
from reports.html_base import esc, table
from reports.tables import UNKNOWN

MAX_BOUNDARY_ROWS = 80
# the page's sections below the first screen: anchor -> title (the contents line links them)
SECTIONS = {"diagnosis": "Diagnosis", "calibration": "Calibration", "floor": "Noise floor",
            "boundaries": "Per-boundary results", "coverage": "Coverage", "sweep": "Sweep points",
            "latency": "Latency and load", "placement": "Placement", "plots": "Plots", "cases": "Worst cases"}
CONTENTS = ('<nav class="contents">Contents: '
            + " &middot; ".join(f'<a href="#{a}">{t}</a>' for a, t in SECTIONS.items()) + "</nav>")


def verdict_header(verdict: Verdict, config: dict) -> str:
    """PASS/FAIL/INCONCLUSIVE, the headline, the reasons and what was not exercised (with what to change), or the
    thresholds that held, and the oracle's settings."""
    word = verdict.word
    t = verdict.thresholds
    if verdict.reasons or verdict.unexercised:
        items = "".join(f"<li>{esc(r)}</li>" for r in verdict.reasons)
        items += "".join(f"<li>not exercised: {esc(u)}</li>" for u in verdict.unexercised)
    else:
        items = (f"<li>all gate checks passed: hard &le; {t.max_hard}, drift &le; {t.max_drift}, errors &le; "
                 f"{t.max_errors}, soft &le; {100 * t.max_soft_rate:.1f}% of requests</li>")
    suite = config.get("suite") or config.get("run_config", {}).get("suite", "")
    meta = (f"run {esc(config.get('run_id', ''))} &middot; suite {esc(suite)} &middot; drift = log-prob "
            f"difference &gt; {t.drift_tolerance:g} with the same tokens &middot; soft = reference top-1/top-2 "
            f"margin &lt; {t.margin_threshold:g} at the first divergence, no drift before or at it, within twice "
            "what the path's numerics move a log-prob")
    return (f'<header class="verdict {word.lower()}"><div class="word">{word}</div>'
            f'<div class="headline">{esc(verdict.headline)}</div><ul>{items}</ul>'
            f'<div class="meta">{meta}</div></header>')


def diagnosis_section(diagnosis: Diagnosis) -> str:
    """The first section: which subsystem the evidence points at, and the per-pool counts behind it."""
    items = "".join(f"<li>{esc(e)}</li>" for e in diagnosis.evidence)
    tbl = table(diagnosis.table, left=("variant",)) if diagnosis.table is not None and len(diagnosis.table) else ""
    return (f'<section id="diagnosis" class="diag"><div class="k">Diagnosis</div><div class="what">'
            f"{esc(diagnosis.headline)}</div><ul>{items}</ul>{tbl}</section>")


def key_figures(df: pd.DataFrame, configs: pd.DataFrame, verdict: Verdict) -> str:
    """The row of big numbers under the verdict."""
    t = verdict.thresholds
    figs = [("requests", verdict.requests, ""), ("exact", verdict.exact, "ok" if verdict.exact else ""),
            ("hard", verdict.hard, _status(verdict.hard, t.max_hard)),
            ("drift", verdict.drift, _status(verdict.drift, t.max_drift)),
            ("soft", f"{verdict.soft} ({100 * verdict.soft_rate:.1f}%)",
             "bad" if verdict.soft_rate > t.max_soft_rate else ("warn" if verdict.soft else "ok")),
            ("errors", verdict.errors, _status(verdict.errors, t.max_errors))]
    if len(df):  # the gated pools (a control is never judged): the columns read here, not a copy of every one
        df = df[["pool", "class", "restored_verify_crossed", "restored_link", "interval", "concurrency", "fault",
                 "spec_accept_length"]]
        df = df[~df["pool"].map(is_control)]
    restored = df[df["restored_verify_crossed"]] if len(df) else df
    if len(restored):
        flagged = int(restored["class"].isin(["hard", "drift"]).sum())
        figs.append(("flagged among turns restoring a verify-crossed checkpoint", f"{flagged}/{len(restored)}",
                     "bad" if flagged else "ok"))
    linked = df[df["restored_link"] == "position"] if len(df) else df
    if len(linked):  # verify steps not reported: linked by positions only
        flagged = int(linked["class"].isin(["hard", "drift"]).sum())
        figs.append(("flagged among turns restoring a checkpoint the previous turn crossed (position-linked)",
                     f"{flagged}/{len(linked)}", "bad" if flagged else "ok"))
    intervals = sorted(int(i) for i in df["interval"].dropna().unique()) if len(df) else []
    figs.append(("intervals", ", ".join(map(str, intervals)) or "-", ""))
    concs = sorted(int(c) for c in df["concurrency"].dropna().unique()) if len(df) else []
    figs.append(("concurrency", ", ".join(map(str, concs)) or "-", ""))
    faults = sorted({str(f) for f in df["fault"].dropna().unique()}) if len(df) else []
    if faults:
        figs.append(("injected fault", ", ".join(faults), "warn"))
    if len(configs) and configs["output_tok_s"].notna().any():
        figs.append(("peak output tok/s", f"{configs['output_tok_s'].max():.1f}", ""))
    accept = df["spec_accept_length"].dropna() if len(df) else []
    if len(accept):
        figs.append(("mean accept length", f"{accept.mean():.2f}", ""))
    cells = "".join(f'<div class="fig {cls}"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
                    for k, v, cls in figs)
    return f'<section class="figures">{cells}</section>'


def _status(count: int, allowed: int) -> str:
    """A figure's colour class: red beyond what the gate allows, amber for a count it allows, green at zero."""
    return "bad" if count > allowed else ("warn" if count else "ok")


def floor_section(floor: NoiseFloor, plot: str) -> str:
    """The observed noise floor beside the tolerance, with the drift histogram."""
    if floor.max is None:
        text = ("<p>No request that restored nothing has a measured drift, so there is no observed floor "
                f"to set beside the tolerance {floor.tolerance:g}.</p>")
    else:
        text = (f"<p>Requests that restored nothing (<code>cached_tokens = 0</code>, {floor.requests}) drift by "
                f"at most <b>{floor.max:.3g}</b> (median {floor.p50:.3g}, p99 {floor.p99:.3g}): that is the "
                f"engine's numerics. Tolerance: <b>{floor.tolerance:g}</b>, "
                f"{floor.tolerance / floor.max if floor.max > 0 else float('inf'):.3g}x the floor.</p>")
    if floor.too_close:
        text += '<p class="warn">The floor is within 10x of the tolerance (see the warnings above).</p>'
    if floor.unmeasured:
        text += (f'<p class="warn">{floor.unmeasured} request(s) have no log-probs on both sides: the margin rule '
                 "alone classified them.</p>")
    return "<h2 id=floor>Log-prob drift and the noise floor</h2>" + text + plot


def boundaries_section(boundaries: pd.DataFrame) -> str:
    """The per-boundary table (only rows with a mismatch, drift or error when it is long)."""
    intro = ("<p>Each request is attributed to boundaries of several kinds (see docs/reports.md): "
             "<code>restored</code> (offset = tokens prefilled after the restored checkpoint), "
             "<code>restored_verify</code> (the restored checkpoint was crossed in the previous turn's verify "
             "step <i>offset</i> with that commit length), <code>restored_position</code> (the engine reports "
             "no verify steps, so the restored checkpoint is linked by position to the previous turn's crossing: "
             "step and commit length unknown), <code>restored_prefill</code> (a checkpoint the previous turn's "
             "prefill took, on the 64-token grid: offset from the interval grid), "
             "<code>crossed_verify</code> (own verify crossings), "
             "<code>crossed_inferred</code> (own crossings from positions, step unknown), "
             "<code>prompt</code>, <code>drift_onset</code> and <code>divergence</code> (offset to the nearest "
             "boundary). <code>onset_at_restore</code>: requests that restored a checkpoint and left the reference "
             "from their first output token, which points at the restored checkpoint.</p>")
    head = "<h2 id=boundaries>Per-boundary results</h2>"
    if boundaries.empty:
        return head + intro + "<p>No boundary attributions (no track interval).</p>"
    flagged = (boundaries["hard"] + boundaries["drift"] + boundaries["soft"] + boundaries["error"]) > 0
    bad, rest = boundaries[flagged].head(MAX_BOUNDARY_ROWS), boundaries[~flagged]

    def row_class(r):
        return "hot" if r["hard"] or r["drift"] else ("warm" if r["soft"] or r["error"] else "")

    shown = (f"<p>{len(bad)} row(s) with a flagged, soft or failed request"
             + (f" (the first {MAX_BOUNDARY_ROWS})" if flagged.sum() > MAX_BOUNDARY_ROWS else "") + "; every row is "
             "in <code>boundaries.csv</code>. A request is counted once per kind it belongs to.</p>"
             + (table(bad, left=("boundary_kind",), row_class=row_class) if len(bad) else ""))
    folded = (f"<details><summary>{len(rest)} row(s) with every request exact</summary>"
              f"{table(rest, left=('boundary_kind',))}</details>" if len(rest) else "")
    return head + f"<details><summary>What the kinds mean</summary>{intro}</details>" + shown + folded


def coverage_section(coverage: pd.DataFrame, plot: str, shapes: pd.DataFrame | None = None) -> str:
    """Cells (verify step holding the boundary, commit length) crossed and restored, per interval; then the
    radix-tree shapes the restores reached."""
    summary = coverage_summary(coverage) if len(coverage) else []
    if not summary:
        cells = ("<p>No verify crossings were reported (no <code>spec_trace</code>), so the (step, commit length) "
                 "cells reached are unknown.</p>")
    else:
        items = "".join(f"<li>interval {s['interval']}: {s['crossed']}/{s['cells']} cells crossed in a verify "
                        f"step, {s['restored']}/{s['cells']} restored by a later turn, {s['restored_flagged']} "
                        "restored cells with a flagged request</li>" for s in summary)
        cells = ("<p>Which (verify step holding the boundary, commit length) cells the run reached "
                 "(<code>coverage.csv</code>); <code>--cover</code> forces every cell on the built-in engine."
                 f"</p><ul>{items}</ul>" + plot)
    return "<h2 id=coverage>Boundary-case coverage</h2>" + cells + tree_shapes_part(shapes)


def tree_shapes_part(shapes: pd.DataFrame | None) -> str:
    """Where restored requests' prefix matches ended in the radix tree (`tree_shapes.csv`), per interval."""
    if shapes is None or not len(shapes):
        return "<h3>Tree shapes</h3><p>No candidate request restored a checkpoint.</p>"
    missed = shapes[(shapes["designed"] > 0) & (shapes["designed_reached"] < shapes["designed"])]
    note = "".join(f'<p class="warn">interval {r["interval"]}: {r["designed"] - r["designed_reached"]} of '
                   f'{r["designed"]} requests designed to reach <code>{esc(r["shape"])}</code> did not (see '
                   "<code>tree_shapes.csv</code>)</p>" for r in missed.to_dict("records"))
    intro = ("<h3>Tree shapes</h3><p>Where each restored request's prefix match ended, from its ids and the "
             "requests that finished before it on its replica (docs/reports.md): <code>checkpoint</code> (at the "
             "checkpoint it restored), <code>split</code> (at or through a node two earlier requests' divergence "
             "split off, without a checkpoint of its own: it fell back to an ancestor's), <code>deeper</code> "
             "(into an edge past the checkpoint it restored); <code>sibling</code>: the checkpoint came from "
             "another session. <i>designed</i>: what the workload meant to reach.</p>")
    return intro + note + table(shapes, left=("shape", "by_concurrency"))


def sweep_section(configs: pd.DataFrame) -> str:
    """The sweep points, with a sentence on cache pressure (evictions) above them."""
    if not len(configs):
        return "<h2 id=sweep>Sweep points</h2><p>none</p>"
    return ("<h2 id=sweep>Sweep points</h2>" + f"<p>{esc(cache_pressure_text(configs))}</p>"
            + table(configs, left=("pool",)))


def cache_pressure_text(configs: pd.DataFrame) -> str:
    """One sentence: were checkpoints or KV pages evicted, at which sweep points, or is it unknown."""
    parts = []
    for name, what in zip(CACHE_COUNTERS[1:], ("checkpoint evictions", "KV page evictions"), strict=True):
        values = configs[name]
        known = values[values != UNKNOWN]
        if not len(known):
            parts.append(f"{what}: unknown (the servers do not expose them)")
            continue
        total = int(pd.to_numeric(known).sum())
        hit = int((pd.to_numeric(known) > 0).sum())
        unknown = len(values) - len(known)
        parts.append(f"{what}: none at any sweep point" if total == 0 and not unknown else
                     f"{what}: {total} at {hit} of {len(values)} sweep points"
                     + (f" ({unknown} unknown)" if unknown else ""))
    return "Cache pressure: " + "; ".join(parts) + "."


def placement_section(config: dict) -> str:
    """Where each replica ran (config.json's pools, harness/ray_pools.py): node, GPUs, CUDA_VISIBLE_DEVICES and
    device, and a row per tensor-parallel rank actor; empty for a run that records none (external endpoints)."""
    rows = []
    for pool, p in (config.get("pools") or {}).items():
        for r in p.get("replicas") or []:
            where = r.get("placement")
            if not isinstance(where, dict):
                continue
            for rank, seat in [(0, where), *enumerate(where.get("ranks") or [], start=1)]:
                node = f"{seat.get('node_ip', '')} ({str(seat.get('node_id') or '')[:8]})"
                rows.append({"pool": pool, "replica": r.get("replica_id"), "rank": rank, "node": node,
                             "gpu_ids": ",".join(map(str, seat.get("gpu_ids") or [])) or "none",
                             "CUDA_VISIBLE_DEVICES": repr(seat.get("cuda_visible_devices", "")),
                             "device": seat.get("device", where.get("device"))})
    if not rows:
        return ""
    return ("<h2 id=placement>Placement</h2><p>Where each replica and its tensor-parallel ranks ran, and the devices "
            "each was given (its placement-group bundle).</p>"
            + table(pd.DataFrame(rows), left=("pool", "replica", "node", "gpu_ids", "CUDA_VISIBLE_DEVICES", "device")))
