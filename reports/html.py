"""report.html: one self-contained page (inline CSS, PNGs as base64), verdict first."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from reports.gate import Verdict
from reports.incidents import incidents_html
from reports.oracle import top_margin
from reports.results import RunResults, attribution_text, crossing_text, divergence_text, value_or_none

WINDOW = 16  # tokens either side of the first divergence in a case's diff
MAX_CASES = {"hard": 25, "soft": 15, "error": 10}
MAX_BOUNDARY_ROWS = 80

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:0 24px 48px}
.verdict{padding:28px 32px;color:#fff}.verdict.pass{background:#2e7d32}.verdict.fail{background:#c62828}
.verdict .word{font-size:64px;font-weight:800;letter-spacing:2px;line-height:1}
.verdict .headline{font-size:22px;margin-top:8px}.verdict ul{margin:12px 0 0;font-size:17px}
.verdict .meta{margin-top:10px;opacity:.85;font-size:14px}
h2{margin-top:36px;border-bottom:2px solid #ddd;padding-bottom:4px}
.figures{display:flex;flex-wrap:wrap;gap:12px;margin-top:20px}
.fig{background:#fff;border:1px solid #ddd;border-radius:8px;padding:10px 16px;min-width:110px}
.fig .v{font-size:28px;font-weight:700}.fig .k{font-size:13px;color:#666}
.fig.hard .v{color:#c62828}.fig.soft .v{color:#b26a00}.fig.error .v{color:#6a1b9a}.fig.exact .v{color:#2e7d32}
table{border-collapse:collapse;font-size:13px;background:#fff}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}th{background:#f0f0f0}
td.l,th.l{text-align:left}tr.hot td{background:#fde7e7}tr.warm td{background:#fff4e0}
.scroll{overflow-x:auto}img{max-width:100%;border:1px solid #ddd;background:#fff;margin:8px 0}
.case{background:#fff;border:1px solid #ddd;border-left:6px solid #999;border-radius:6px;
padding:10px 14px;margin:14px 0}
.case.hard{border-left-color:#c62828}.case.soft{border-left-color:#ef9f27}.case.error{border-left-color:#6a1b9a}
.case h3{margin:0 0 6px;font-size:15px;font-family:ui-monospace,monospace}
.case p{margin:4px 0;font-size:14px}
.tok td,.tok th{font-family:ui-monospace,monospace;font-size:12px;text-align:center;padding:2px 4px}
.tok td.diff{background:#fde7e7}.tok td.first{background:#c62828;color:#fff;font-weight:700}
pre{background:#f4f4f4;padding:8px;white-space:pre-wrap;word-break:break-all;font-size:13px}
mark{background:#ffcdd2}.warn{background:#fff4e0;border:1px solid #ef9f27;padding:8px 12px;border-radius:6px}
"""


def esc(value) -> str:
    """HTML-escaped text of any value; missing values are empty."""
    value = value_or_none(value)
    return "" if value is None else html.escape(str(value), quote=True)


def _decoder(tokenizer: str | None):
    """A function ids -> text for byte-tokenizer records, else None (ids only)."""
    if tokenizer != "byte":
        return None
    try:
        from protocol.tokenizer import BYTE_TOKENIZER
    except ImportError:
        return None

    def decode(ids):
        try:
            return BYTE_TOKENIZER.decode(ids, keep_special=True)
        except ValueError:
            return None

    return decode


def token_label(tok: int | None, decode) -> str:
    """A short printable form of one token for the diff grid."""
    if tok is None or decode is None:
        return ""
    names = {32: "\u2423", 10: "\\n", 9: "\\t", 13: "\\r"}
    if tok in names:
        return names[tok]
    if 33 <= tok <= 126:
        return chr(tok)
    if 0 <= tok < 256:
        return f"\\x{tok:02x}"
    return decode([tok]) or "?"


def _table(df: pd.DataFrame, left: tuple[str, ...] = (), row_class=None) -> str:
    head = "".join(f'<th class="{"l" if c in left else ""}">{esc(c)}</th>' for c in df.columns)
    body = []
    for r in df.to_dict("records"):
        cls = row_class(r) if row_class else ""
        cells = []
        for c in df.columns:
            v = value_or_none(r[c])
            text = f"{v:.4g}" if isinstance(v, float) else esc(v)
            cells.append(f'<td class="{"l" if c in left else ""}">{text}</td>')
        body.append(f'<tr class="{cls}">{"".join(cells)}</tr>')
    return f'<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def _verdict(verdict: Verdict, config: dict) -> str:
    word = "PASS" if verdict.passed else "FAIL"
    t = verdict.thresholds
    if verdict.reasons:
        items = "".join(f"<li>{esc(r)}</li>" for r in verdict.reasons)
    else:
        items = (f"<li>all gate checks passed: hard &le; {t.max_hard}, errors &le; {t.max_errors}, "
                 f"soft &le; {100 * t.max_soft_rate:.1f}% of requests</li>")
    suite = config.get("suite") or config.get("run_config", {}).get("suite", "")
    meta = (f"run {esc(config.get('run_id', ''))} &middot; suite {esc(suite)} &middot; "
            f"soft = reference top-1/top-2 margin &lt; {t.margin_threshold:g} at the first divergence")
    return (f'<header class="verdict {word.lower()}"><div class="word">{word}</div>'
            f'<div class="headline">{esc(verdict.headline)}</div><ul>{items}</ul>'
            f'<div class="meta">{meta}</div></header>')


def _figures(df: pd.DataFrame, configs: pd.DataFrame, verdict: Verdict) -> str:
    figs = [("requests", verdict.requests, ""), ("exact", verdict.exact, "exact"),
            ("hard", verdict.hard, "hard"), ("soft", f"{verdict.soft} ({100 * verdict.soft_rate:.1f}%)", "soft"),
            ("errors", verdict.errors, "error")]
    restored = df[df["restored_verify_crossed"]] if len(df) else df
    if len(restored):
        hard = int((restored["class"] == "hard").sum())
        figs.append(("hard among turns restoring a verify-crossed checkpoint", f"{hard}/{len(restored)}", "hard"))
    intervals = sorted(int(i) for i in df["interval"].dropna().unique()) if len(df) else []
    figs.append(("intervals", ", ".join(map(str, intervals)) or "-", ""))
    concs = sorted(int(c) for c in df["concurrency"].dropna().unique()) if len(df) else []
    figs.append(("concurrency", ", ".join(map(str, concs)) or "-", ""))
    faults = sorted({str(f) for f in df["fault"].dropna().unique()}) if len(df) else []
    if faults:
        figs.append(("injected fault", ", ".join(faults), "error"))
    if len(configs) and configs["output_tok_s"].notna().any():
        figs.append(("peak output tok/s", f"{configs['output_tok_s'].max():.1f}", ""))
    accept = df["spec_accept_length"].dropna() if len(df) else []
    if len(accept):
        figs.append(("mean accept length", f"{accept.mean():.2f}", ""))
    cells = "".join(f'<div class="fig {cls}"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
                    for k, v, cls in figs)
    return f'<section class="figures">{cells}</section>'


def _boundaries(boundaries: pd.DataFrame) -> str:
    if boundaries.empty:
        return "<p>No boundary attributions (no candidate record has a track interval).</p>"
    shown = boundaries
    note = ""
    if len(boundaries) > MAX_BOUNDARY_ROWS:
        mism = boundaries[(boundaries["hard"] + boundaries["soft"] + boundaries["error"]) > 0]
        shown = mism.head(MAX_BOUNDARY_ROWS)
        note = (f"<p>Showing {len(shown)} of {len(boundaries)} rows (those with a mismatch or error); "
                f"every row is in <code>boundaries.csv</code>.</p>")

    def row_class(r):
        return "hot" if r["hard"] else ("warm" if r["soft"] or r["error"] else "")

    return note + _table(shown, left=("boundary_kind",), row_class=row_class)


def _plot_img(path: Path, alt: str) -> str:
    if not path.is_file():
        return f"<p>missing plot {esc(path.name)}</p>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def _token_grid(cand: list[int], ref: list[int], ref_top: list | None, p: int, decode) -> str:
    lo, hi = max(0, p - WINDOW), p + WINDOW + 1
    idx = [i for i in range(lo, hi) if i < max(len(cand), len(ref))]

    def cell(seq, i, with_label):
        tok = seq[i] if i < len(seq) else None
        other = (ref if seq is cand else cand)
        o = other[i] if i < len(other) else None
        cls = "first" if i == p else ("diff" if tok != o else "")
        text = esc(token_label(tok, decode)) if with_label else esc(tok if tok is not None else "-")
        return f'<td class="{cls}">{text}</td>'

    def margin(i):
        m = top_margin(ref_top[i]) if ref_top and i < len(ref_top) else None
        return f"<td>{m:.2f}</td>" if m is not None else "<td></td>"

    rows = [("output index", "".join(f"<th>{i}</th>" for i in idx)),
            ("candidate id", "".join(cell(cand, i, False) for i in idx)),
            ("reference id", "".join(cell(ref, i, False) for i in idx))]
    if decode is not None:
        rows.insert(2, ("candidate tok", "".join(cell(cand, i, True) for i in idx)))
        rows.append(("reference tok", "".join(cell(ref, i, True) for i in idx)))
    rows.append(("ref margin", "".join(margin(i) for i in idx)))
    body = "".join(f'<tr><th class="l">{esc(name)}</th>{cells}</tr>' for name, cells in rows)
    return f'<div class="scroll"><table class="tok">{body}</table></div>'


def _text_diff(cand: list[int], ref: list[int], p: int, decode) -> str:
    if decode is None:
        return ""
    lo, hi = max(0, p - WINDOW), p + WINDOW + 1
    lines = []
    for name, seq in (("candidate", cand), ("reference", ref)):
        before, after = decode(seq[lo:p]), decode(seq[p:hi])
        if before is None or after is None:
            return ""
        lines.append(f"{name:9}: {'…' if lo else ''}{esc(before)}<mark>{esc(after)}</mark>"
                     f"{'…' if hi < len(seq) else ''}")
    return f"<pre>{chr(10).join(lines)}</pre>"


def _top_k(top: list | None, decode) -> str:
    if not top:
        return "none"
    items = []
    for e in top:
        label = f" '{token_label(int(e[1]), decode)}'" if decode else ""
        items.append(f"{e[1]}{label}: {float(e[0]):.3f}")
    return esc(", ".join(items))


def _case(row: dict, cand: dict, ref: dict | None) -> str:
    cls = row["class"]
    head = f'<h3>{esc(row["key"])} &mdash; {esc(cls.upper())} &mdash; {esc(row["detail"])}</h3>'
    info = (f"<p>session {esc(row['session_id'])}, turn {esc(row['turn'])}, sweep point {esc(row['pool'])} "
            f"c{esc(row['concurrency'])}, replica {esc(row['replica_id'])}, input {esc(row['input_len'])} tokens, "
            f"cached_tokens {esc(row['cached_tokens'])}</p>")
    parts = [head, info, f"<p><b>Attribution:</b> {esc(attribution_text(row))}</p>"]
    trace = cand.get("spec_trace")
    if row["crossings"]:
        items = "".join(f"<li>{esc(crossing_text(x))}</li>" for x in row["crossings"])
        parts.append(f"<p><b>Boundary crossings ({esc(row['crossing_source'])}):</b></p><ul>{items}</ul>")
    elif trace is None:
        parts.append("<p>spec_trace: not reported by the engine</p>")
    p = value_or_none(row["first_divergence"])
    if cls != "error" and p is not None and ref is not None:
        c_out, r_out = list(cand.get("output_ids") or []), list(ref.get("output_ids") or [])
        decode = _decoder(cand.get("tokenizer"))
        r_top, c_top = ref.get("output_top_logprobs") or [], cand.get("output_top_logprobs") or []
        parts.append(f"<p><b>First divergence:</b> {esc(divergence_text(row))}</p>")
        parts.append(_token_grid(c_out, r_out, r_top, p, decode))
        parts.append(_text_diff(c_out, r_out, p, decode))
        parts.append(f"<p>reference top-k at {p}: {_top_k(r_top[p] if p < len(r_top) else None, decode)}<br>"
                     f"candidate top-k at {p}: {_top_k(c_top[p] if p < len(c_top) else None, decode)}</p>")
    return f'<article class="case {esc(cls)}">{"".join(parts)}</article>'


def worst_cases(df: pd.DataFrame) -> pd.DataFrame:
    """Hard first (most confident reference first), then soft by margin (closest to hard first), then errors."""
    out = []
    for cls in ("hard", "soft", "error"):
        g = df[df["class"] == cls].sort_values(["ref_margin", "key"], ascending=[False, True], na_position="last")
        out.append(g.head(MAX_CASES[cls]))
    return pd.concat(out) if out else df.head(0)


def render_html(results: RunResults) -> str:
    """The self-contained report page."""
    r = results
    df, boundaries, configs, verdict, config = r.df, r.boundaries, r.configs, r.verdict, r.config
    records, references, plots, warnings = r.records, r.references, r.plots, r.warnings
    word = "PASS" if verdict.passed else "FAIL"
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>specgate {esc(word)}: "
             f"{esc(config.get('run_id', ''))}</title><style>{CSS}</style></head><body>",
             _verdict(verdict, config), "<main>", _figures(df, configs, verdict)]
    if warnings:
        parts.append('<div class="warn">' + "<br>".join(esc(w) for w in warnings) + "</div>")
    parts.append(incidents_html(config, records))
    parts += ["<h2>Per-boundary results</h2>",
              "<p>Each request is attributed to boundaries of several kinds (see docs/reports.md): "
              "<code>restored</code> (offset = tokens prefilled after the restored checkpoint), "
              "<code>restored_verify</code> (the restored checkpoint was crossed in the previous turn's verify "
              "step <i>offset</i> with that commit length), <code>crossed_verify</code> (own verify crossings), "
              "<code>prompt</code> and <code>divergence</code> (offset to the nearest boundary).</p>",
              _boundaries(boundaries), "<h2>Sweep points</h2>",
              _table(configs, left=("pool",)) if len(configs) else "<p>none</p>", "<h2>Plots</h2>"]
    for name, path in plots.items():
        parts.append(_plot_img(Path(path), name.replace("_", " ")))
    cases = worst_cases(df) if len(df) else df
    parts.append(f"<h2>Worst cases ({len(cases)})</h2>")
    if not len(cases):
        parts.append("<p>Every request matched its reference exactly.</p>")
    for row in cases.to_dict("records"):
        cand = records.get(row["key"], {})
        parts.append(_case(row, cand, references.get(str(row["input_hash"]))))
    parts.append("</main></body></html>")
    return "\n".join(parts)


def write_html(path: str | Path, results: RunResults) -> Path:
    """Render and write report.html."""
    Path(path).write_text(render_html(results), encoding="utf-8")
    return Path(path)
