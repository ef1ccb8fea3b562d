"""Building blocks of report.html: the style sheet, escaping, tables and inline images."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from reports.results import value_or_none

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
main{max-width:1200px;margin:0 auto;padding:0 24px 48px}
.verdict{padding:28px 32px;color:#fff}.verdict.pass{background:#2e7d32}.verdict.fail{background:#c62828}
.verdict.inconclusive{background:#ef6c00}
.verdict .word{font-size:64px;font-weight:800;letter-spacing:2px;line-height:1}
.verdict .headline{font-size:22px;margin-top:8px}.verdict ul{margin:12px 0 0;font-size:17px}
.verdict .meta{margin-top:10px;opacity:.85;font-size:14px}
h2{margin-top:36px;border-bottom:2px solid #ddd;padding-bottom:4px}
.figures{display:flex;flex-wrap:wrap;gap:12px;margin-top:20px}
.fig{background:#fff;border:1px solid #ddd;border-radius:8px;padding:10px 16px;min-width:110px}
.fig .v{font-size:28px;font-weight:700}.fig .k{font-size:13px;color:#666}
.fig.bad{border-color:#c62828;background:#fdecea}.fig.bad .v{color:#c62828}
.fig.warn{border-color:#ef9f27;background:#fff8e8}.fig.warn .v{color:#b26a00}.fig.ok .v{color:#2e7d32}
table{border-collapse:collapse;font-size:13px;background:#fff}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}th{background:#f0f0f0}
td.l,th.l{text-align:left}tr.hot td{background:#fde7e7}tr.warm td{background:#fff4e0}
.scroll{overflow-x:auto}img{max-width:100%;border:1px solid #ddd;background:#fff;margin:8px 0}
.case{background:#fff;border:1px solid #ddd;border-left:6px solid #999;border-radius:6px;
padding:10px 14px;margin:14px 0}
.case.hard{border-left-color:#c62828}.case.drift{border-left-color:#6a1b9a}.case.soft{border-left-color:#ef9f27}.case.error{border-left-color:#6a1b9a}
.case h3{margin:0 0 6px;font-size:15px;font-family:ui-monospace,monospace}
.case p{margin:4px 0;font-size:14px}
.tok td,.tok th{font-family:ui-monospace,monospace;font-size:12px;text-align:center;padding:2px 4px}
.tok td.diff{background:#fde7e7}.tok td.first{background:#c62828;color:#fff;font-weight:700}
pre{background:#f4f4f4;padding:8px;white-space:pre-wrap;word-break:break-all;font-size:13px}
.diag{background:#fff;border:2px solid #1d1d1f;border-radius:8px;padding:12px 18px;margin-top:20px}
.diag .what{font-size:19px;font-weight:700}
mark{background:#ffcdd2}.warn{background:#fff4e0;border:1px solid #ef9f27;padding:8px 12px;border-radius:6px}
.where{background:#fff;border:2px solid #1d1d1f;border-radius:8px;padding:4px 18px 12px;margin-top:20px}
.where h2{margin:8px 0 0}.where .reading{font-size:17px;font-weight:600;margin:8px 0}tr.ok td{background:#edf7ee}
.where .cols{display:flex;flex-wrap:wrap;gap:8px 28px;align-items:flex-start}.where .cols>div{flex:1 1 420px}
.where ol{margin:4px 0;padding-left:22px;font-size:14px}
.grids{display:flex;flex-wrap:wrap;gap:18px}.grid .k{font-size:13px;color:#555;margin:6px 0}
table.cells td,table.cells th{width:26px;text-align:center;font-size:11px;padding:1px 2px}
.cell.bad{background:#e57373;color:#000;font-weight:700}.cell.ok{background:#a5d6a7}.cell.none{background:#eee;color:#999}
.cell.na{background:repeating-linear-gradient(45deg,#fafafa,#fafafa 3px,#e6e6e6 3px,#e6e6e6 5px)}
.legend{font-size:12px;color:#444;margin:4px 0}
.legend .cell{display:inline-block;padding:0 6px;margin:0 4px 0 10px;border-radius:3px}
nav.contents{margin:18px 0 0;font-size:14px}nav.contents a{color:#1d4ed8}
details summary{cursor:pointer;color:#1d4ed8;margin:8px 0}
@media (max-width:700px){.verdict{padding:18px 16px}.verdict .word{font-size:40px}.verdict .headline{font-size:17px}
.verdict ul{font-size:14px;padding-left:18px}main{padding:0 10px 32px}.fig{min-width:80px;padding:6px 10px}
.fig .v{font-size:20px}.where .reading{font-size:16px}}
"""


def esc(value) -> str:
    """HTML-escaped text of any value; missing values are empty."""
    value = value_or_none(value)
    return "" if value is None else html.escape(str(value), quote=True)


def table(df: pd.DataFrame, left: tuple[str, ...] = (), row_class=None) -> str:
    """An HTML table of a frame (floats to 4 significant digits), in a horizontally scrolling box."""
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


def plot_img(path: Path, alt: str) -> str:
    """The PNG at `path` inlined as a base64 <img>."""
    if not path.is_file():
        return f"<p>missing plot {esc(path.name)}</p>"
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'
