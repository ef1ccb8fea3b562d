"""The report's first answer after the verdict: where the flagged requests are, read differentially.

Every gated request falls in one kind by what it restored (nothing; a checkpoint its previous turn crossed inside
a verify step; one crossed by plain decode; one its prefill took; another session's), and the kinds that flagged
are set beside those that stayed exact: that contrast, not the counts alone, is what points at a subsystem
(#37817: only verify-crossed restores flag). For verify-crossed restores the (verify step holding the boundary,
commit length) cells are drawn per interval, flagged against exact. Then the most likely subsystem and links to
the worst cases.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from reports.frame_rows import records
from reports.html_base import esc

FLAGGED = ("hard", "drift")
# restore kinds, in the order they are shown: key -> what the requests of that kind did
KINDS = {
    "verify": "restored a checkpoint that their previous turn crossed inside a verify step",
    "generated": "restored a checkpoint that their previous turn crossed while generating (the engine reports no "
                 "verify steps)",
    "decode": "restored a checkpoint that their previous turn crossed by plain decode (no speculation)",
    "prefill": "restored a checkpoint that their previous turn's prefill took",
    "other": "restored a checkpoint of another session or of an earlier turn",
    "nothing": "restored nothing",
}


def restore_kind(row: dict) -> str:
    """The KINDS key of one request, from its restore link (reports/links.py) and whether its pool speculates."""
    cached = row.get("cached_tokens")
    if cached is None or pd.isna(cached) or cached <= 0:
        return "nothing"
    link = row.get("restored_link")
    if link == "verify":
        return "verify"
    if link == "position":
        block = row.get("block_size")
        return "decode" if block is None or pd.isna(block) else "generated"
    return "prefill" if link == "prefill" else "other"


def kind_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per restore kind with requests: requests, flagged (hard + drift), soft, exact and errors."""
    rows = []
    kinds = np.array([restore_kind(r) for r in records(df, ["cached_tokens", "restored_link", "block_size"])],
                     dtype=object)  # a kind's one string per row, not a row's own class string
    classes = df["class"]
    for key, what in KINDS.items():
        mine = classes[kinds == key] if len(df) else classes
        if len(mine):
            rows.append({"kind": key, "requests": what, "n": len(mine), "flagged": int(mine.isin(FLAGGED).sum()),
                         "soft": int((mine == "soft").sum()), "exact": int((mine == "exact").sum()),
                         "errors": int((mine == "error").sum())})
    return pd.DataFrame(rows, columns=["kind", "requests", "n", "flagged", "soft", "exact", "errors"])


def reading(kinds: pd.DataFrame) -> str:
    """The differential reading in one or two sentences."""
    if not len(kinds):
        return "No gated request was recorded."
    flagged = kinds[kinds["flagged"] > 0]
    total = int(kinds["flagged"].sum())
    clean = kinds[(kinds["flagged"] == 0) & (kinds["n"] > 0)]
    exact = "; ".join(f"the {int(r.n)} that {r.requests} were exact" if r.exact == r.n else
                      f"of the {int(r.n)} that {r.requests}, none was flagged" for r in clean.itertuples())
    if total == 0:
        return "No request was flagged: " + ", ".join(f"{int(r.n)} {r.requests}" for r in kinds.itertuples()) + "."
    if len(flagged) == 1:
        r = flagged.iloc[0]
        head = (f"Every flagged request ({total}) {r['requests']}" if r["flagged"] == total else "")
        share = f" ({int(r['flagged'])} of the {int(r['n'])} that did)" if r["flagged"] < r["n"] else \
            f" (all {int(r['n'])} that did)"
        return head + share + (f"; {exact}." if exact else ".")
    parts = ", ".join(f"{int(r.flagged)} of {int(r.n)} that {r.requests}" for r in flagged.itertuples())
    return f"{total} flagged requests: {parts}" + (f"; {exact}." if exact else ".")


def cell_grids(df: pd.DataFrame) -> str:
    """Per interval, the (verify step, commit length) cells of verify-crossed restores: flagged / restored, coloured
    by status, with a legend; empty where no restore was verify-crossed."""
    linked = df.loc[df["restored_verify_crossed"].fillna(False).astype(bool),
                    ["interval", "block_size", "restored_crossing_step", "restored_crossing_commit_len", "class"]] \
        if len(df) else df
    if not len(linked):
        return ""
    out = ['<p class="legend"><span class="cell bad">f/n</span> f of the n requests that restored a checkpoint '
           'crossed in that cell were flagged <span class="cell ok">0/n</span> all exact '
           '<span class="cell none">&middot;</span> not reached (no request restored such a checkpoint)</p>']
    for interval, g in linked.groupby("interval"):
        blocks = g["block_size"].dropna()
        width = int(blocks.max()) if len(blocks) else int(g["restored_crossing_commit_len"].max())
        counts: dict[tuple[int, int], list[int]] = {}
        for step, commit, cls in zip(g["restored_crossing_step"], g["restored_crossing_commit_len"], g["class"],
                                     strict=True):
            if pd.isna(step) or pd.isna(commit):
                continue
            c = counts.setdefault((int(step), int(commit)), [0, 0])
            c[0] += cls in FLAGGED
            c[1] += 1
        head = "".join(f"<th>{k}</th>" for k in range(1, width + 1))
        rows = []
        for step in range(width):
            cells = []
            for commit in range(1, width + 1):
                f, n = counts.get((step, commit), (0, 0))
                if step >= commit:  # the boundary lies in the accepted part only: step < commit length
                    cells.append('<td class="cell na"></td>')
                elif n == 0:
                    cells.append('<td class="cell none">&middot;</td>')
                else:
                    cells.append(f'<td class="cell {"bad" if f else "ok"}">{f}/{n}</td>')
            rows.append(f"<tr><th>{step}</th>{''.join(cells)}</tr>")
        out.append(f'<div class="grid"><div class="k">interval {int(interval)}: rows = verify step holding the '
                   f'boundary, columns = commit length</div><table class="cells"><tr><th></th>{head}</tr>'
                   f'{"".join(rows)}</table></div>')
    return '<div class="grids">' + "".join(out) + "</div>"


def _pct(events: int, turns: int) -> str:
    return f"{events} of {turns} ({100 * events / turns:.1f}%)" if turns else f"{events} of 0"


def rates_part(findings) -> str:
    """The flip-rate tests that found flips piling up (Verdict.rate_findings, reports/flip_rates.py), both rates side
    by side: where they are, what was counted, the group's rate against its comparison's, p and its level."""
    if not findings:
        return ""
    rows = []
    for t in findings:
        d = t.as_dict()
        where = f"{d['pool']} at {d['point']}" if d["point"] else f"{d['pool']} over {d['strata']} sweep point(s)"
        rows.append(f'<tr class="hot"><td class="l">{esc(where)}</td><td class="l">{esc(d["event"])}</td>'
                    f'<td class="l">{esc(d["group"])}: {_pct(d["events"], d["turns"])}</td>'
                    f'<td class="l">{esc(d["base"])}: {_pct(d["base_events"], d["base_turns"])}</td>'
                    f"<td>{d['p']:.2g} &le; {d['level']:.2g}</td></tr>")
    return ("<p><b>Flips pile up</b> where numerics do not put them (one-sided exact tests, the run's family held to "
            '0.001):</p><div class="scroll"><table><tr><th class="l">pool</th><th class="l">counted</th>'
            '<th class="l">group</th><th class="l">against</th><th>p</th></tr>' + "".join(rows) + "</table></div>")


def where_section(df: pd.DataFrame, headline: str, worst: list[tuple[str, str]], rate_findings=()) -> str:
    """The first section: the reading, the kinds table, the flip-rate findings side by side (`rate_findings`,
    Verdict's), the cell grids, the most likely subsystem (`headline`, the diagnosis's) and links to the worst
    cases (`worst`: (anchor, text) pairs)."""
    kinds = kind_table(df) if len(df) else kind_table(pd.DataFrame(
        columns=["cached_tokens", "restored_link", "block_size", "class"]))
    rows = "".join(f'<tr class="{"hot" if r.flagged else ("ok" if r.n else "")}"><td class="l">{esc(r.requests)}'
                   f"</td><td>{r.n}</td><td>{r.flagged}</td><td>{r.soft}</td><td>{r.exact}</td><td>{r.errors}</td>"
                   "</tr>" for r in kinds.itertuples())
    table = ('<div class="scroll"><table><tr><th class="l">requests that ...</th><th>requests</th><th>flagged</th>'
             f"<th>soft</th><th>exact</th><th>errors</th></tr>{rows}</table></div>")
    links = "".join(f'<li><a href="#{esc(a)}">{esc(t)}</a></li>' for a, t in worst)
    cases = f"<p><b>Worst cases:</b></p><ol>{links}</ol>" if links else ""
    return (f'<section id="where" class="where"><h2>Where</h2><p class="reading">{esc(reading(kinds))}</p>'
            f'<div class="cols"><div>{table}{rates_part(rate_findings)}'
            f'<p><b>Most likely:</b> {esc(headline)}</p>{cases}</div>'
            f"<div>{cell_grids(df)}</div></div></section>")
