"""The worst cases of report.html: one card per request with its attribution and a token-level diff."""

from __future__ import annotations

import functools

import pandas as pd

from protocol.tokenizer import BYTE_TOKENIZER
from reports.crossing_cells import crossing_list
from reports.html_base import esc
from reports.oracle import position_drift, top_margin
from reports.results import attribution_text, crossing_text, divergence_text, drift_text, value_or_none

WINDOW = 16  # tokens either side of the first divergence (or drift onset) in a case's diff
MAX_CASES = {"hard": 25, "drift": 25, "soft": 15, "error": 10}


@functools.lru_cache(maxsize=8)
def _load(spec: str):
    """The tokenizer a record names ("byte", or the path of the target's tokenizer), or None if unreadable here."""
    if spec == "byte":
        return BYTE_TOKENIZER
    from protocol.hf_tokenizer import load_tokenizer
    from protocol.tokenizer import TokenizerError

    try:
        return load_tokenizer(spec)
    except (TokenizerError, ImportError, OSError):
        return None


def _decoder(tokenizer: str | None):
    """A function ids -> text through the record's tokenizer (None when it cannot be loaded here: ids only).

    The byte tokenizer's function carries `byte_level` so token labels can name single bytes."""
    tok = _load(tokenizer) if tokenizer and tokenizer != "unknown" else None
    if tok is None:
        return None

    def decode(ids):
        try:
            return tok.decode(ids, keep_special=True)
        except ValueError:
            return None

    decode.byte_level = tok is BYTE_TOKENIZER
    return decode


def token_label(tok: int | None, decode) -> str:
    """A short printable form of one token for the diff grid."""
    if tok is None or decode is None:
        return ""
    names = {32: "\u2423", 10: "\\n", 9: "\\t", 13: "\\r"}
    if not getattr(decode, "byte_level", True):  # a multi-character token: its text, whitespace made visible
        text = decode([tok])
        return "?" if text is None else "".join(names.get(ord(ch), ch) for ch in text) or "?"
    if tok in names:
        return names[tok]
    if 33 <= tok <= 126:
        return chr(tok)
    if 0 <= tok < 256:
        return f"\\x{tok:02x}"
    return decode([tok]) or "?"


def _token_grid(cand: dict, ref: dict, p: int, decode, tolerance: float | None) -> str:
    c_ids, r_ids = list(cand.get("output_ids") or []), list(ref.get("output_ids") or [])
    r_top, c_top = ref.get("output_top_logprobs") or [], cand.get("output_top_logprobs") or []
    c_lp, r_lp = cand.get("output_logprobs") or [], ref.get("output_logprobs") or []
    lo, hi = max(0, p - WINDOW), p + WINDOW + 1
    idx = [i for i in range(lo, hi) if i < max(len(c_ids), len(r_ids))]

    def at(seq, i):
        return seq[i] if i < len(seq) else None

    def cell(seq, other, i, with_label):
        tok, o = at(seq, i), at(other, i)
        cls = "first" if i == p else ("diff" if tok != o else "")
        text = esc(token_label(tok, decode)) if with_label else esc(tok if tok is not None else "-")
        return f'<td class="{cls}">{text}</td>'

    def margin(i):
        m = top_margin(at(r_top, i))
        return f"<td>{m:.2f}</td>" if m is not None else "<td></td>"

    def drift(i):
        if at(c_ids, i) != at(r_ids, i):
            return "<td></td>"
        d = position_drift(at(c_lp, i), at(r_lp, i), at(c_top, i), at(r_top, i))
        cls = "diff" if d is not None and tolerance is not None and d > tolerance else ""
        return f'<td class="{cls}">{d:.1e}</td>' if d is not None else "<td></td>"

    rows = [("output index", "".join(f"<th>{i}</th>" for i in idx)),
            ("candidate id", "".join(cell(c_ids, r_ids, i, False) for i in idx)),
            ("reference id", "".join(cell(r_ids, c_ids, i, False) for i in idx))]
    if decode is not None:
        rows.insert(2, ("candidate tok", "".join(cell(c_ids, r_ids, i, True) for i in idx)))
        rows.append(("reference tok", "".join(cell(r_ids, c_ids, i, True) for i in idx)))
    rows.append(("ref margin", "".join(margin(i) for i in idx)))
    rows.append(("log-prob drift", "".join(drift(i) for i in idx)))
    body = "".join(f'<tr><th class="l">{esc(name)}</th>{cells}</tr>' for name, cells in rows)
    return f'<div class="scroll"><table class="tok">{body}</table></div>'


def _window_grid(row: dict, cand: dict, decode) -> str:
    """The restore window around where it passed its limits: per prompt token past the restored checkpoint, the
    candidate's and the reference's log-prob (harness/window.py, reports/window.py)."""
    start, onset = value_or_none(row.get("window_start")), value_or_none(row.get("window_onset_pos"))
    c_lp, r_lp = cand.get("window_logprobs") or [], cand.get("window_ref_logprobs") or []
    ids = cand.get("input_ids") or []
    if start is None or onset is None or not c_lp or len(c_lp) != len(r_lp):
        return ""
    start, onset = int(start), int(onset)
    first = start + 1  # window index i is prompt position start + 1 + i
    idx = [p for p in range(max(first, onset - WINDOW), onset + WINDOW + 1) if p - first < len(c_lp)]

    def num(v):
        return f"{v:.3f}" if isinstance(v, (int, float)) else ""

    def diff(p):
        a, b = c_lp[p - first], r_lp[p - first]
        d = abs(a - b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None
        return f'<td class="{"first" if p == onset else ""}">{d:.1e}</td>' if d is not None else "<td></td>"

    rows = [("prompt position", "".join(f"<th>{p}</th>" for p in idx))]
    if decode is not None and ids:
        rows.append(("token", "".join(f"<td>{esc(token_label(ids[p] if p < len(ids) else None, decode))}</td>"
                                      for p in idx)))
    rows += [("candidate log-prob", "".join(f"<td>{num(c_lp[p - first])}</td>" for p in idx)),
             ("reference log-prob", "".join(f"<td>{num(r_lp[p - first])}</td>" for p in idx)),
             ("difference", "".join(diff(p) for p in idx))]
    body = "".join(f'<tr><th class="l">{esc(name)}</th>{cells}</tr>' for name, cells in rows)
    return (f"<p><b>Restore window</b> (prompt tokens past the restored checkpoint {start}, scored on the candidate "
            f"and the reference): it passed its limits at prompt token {onset}</p>"
            f'<div class="scroll"><table class="tok">{body}</table></div>')


WHITESPACE = {" ": "\u2423", "\n": "\u21b5\n", "\t": "\u21e5", "\r": "\u240d"}


def visible(text: str) -> str:
    """`text` with its whitespace drawn (a diff that is only spaces or newlines must not look empty)."""
    return "".join(WHITESPACE.get(ch, ch) for ch in text)


def _text_diff(cand: list[int], ref: list[int], p: int, decode) -> str:
    if decode is None:
        return ""
    lo, hi = max(0, p - WINDOW), p + WINDOW + 1
    lines = []
    for name, seq in (("candidate", cand), ("reference", ref)):
        before, after = decode(seq[lo:p]), decode(seq[p:hi])
        if before is None or after is None:
            return ""
        lines.append(f"{name:9}: {'…' if lo else ''}{esc(before)}<mark>{esc(visible(after))}</mark>"
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


def case_anchor(index: int) -> str:
    """The page anchor of the index-th worst case (0-based)."""
    return f"case-{index + 1}"


def case_link_text(row: dict) -> str:
    """A worst case in one line, for the links of the first screen: class, request and where it went wrong."""
    where = divergence_text(row) if value_or_none(row.get("first_divergence")) is not None else drift_text(row)
    return f"{str(row['class']).upper()} {row['key']}: {where}"


def case_card(row: dict, cand: dict, ref: dict | None, tolerance: float | None = None, anchor: str = "") -> str:
    """One worst case: class, attribution, crossings, drift, and the diff around the first flagged position."""
    cls = row["class"]
    head = f'<h3>{esc(row["key"])} &mdash; {esc(cls.upper())} &mdash; {esc(row["detail"])}</h3>'
    info = (f"<p>session {esc(row['session_id'])}, turn {esc(row['turn'])}, sweep point {esc(row['pool'])} "
            f"c{esc(row['concurrency'])}, replica {esc(row['replica_id'])}, input {esc(row['input_len'])} tokens, "
            f"cached_tokens {esc(row['cached_tokens'])}</p>")
    parts = [head, info, f"<p><b>Attribution:</b> {esc(attribution_text(row))}</p>"]
    trace = cand.get("spec_trace")
    if crossings := crossing_list(row["crossings"]):
        items = "".join(f"<li>{esc(crossing_text(x))}</li>" for x in crossings)
        parts.append(f"<p><b>Boundary crossings ({esc(row['crossing_source'])}):</b></p><ul>{items}</ul>")
    elif trace is None:
        parts.append("<p>spec_trace: not reported by the engine</p>")
    if cls != "error":
        parts.append(f"<p><b>Log-probs:</b> {esc(drift_text(row))}</p>")
    if row.get("window_status") == "flagged":
        parts.append(_window_grid(row, cand, _decoder(cand.get("tokenizer"))))
    p = value_or_none(row["first_divergence"])
    onset = value_or_none(row["drift_onset"])
    at = p if p is not None else onset
    if cls != "error" and at is not None and ref is not None:
        decode = _decoder(cand.get("tokenizer"))
        c_out, r_out = list(cand.get("output_ids") or []), list(ref.get("output_ids") or [])
        r_top, c_top = ref.get("output_top_logprobs") or [], cand.get("output_top_logprobs") or []
        if p is not None:
            parts.append(f"<p><b>First divergence:</b> {esc(divergence_text(row))}</p>")
        parts.append(_token_grid(cand, ref, at, decode, tolerance))
        parts.append(_text_diff(c_out, r_out, at, decode))
        parts.append(f"<p>reference top-k at {at}: {_top_k(r_top[at] if at < len(r_top) else None, decode)}<br>"
                     f"candidate top-k at {at}: {_top_k(c_top[at] if at < len(c_top) else None, decode)}</p>")
    ident = f' id="{esc(anchor)}"' if anchor else ""
    return f'<article{ident} class="case {esc(cls)}">{"".join(parts)}</article>'


def worst_cases(df: pd.DataFrame) -> pd.DataFrame:
    """Hard first (most confident reference first), then drift (largest first), soft by margin (closest to
    hard first), then errors."""
    out = []
    for cls, by, ascending in (("hard", "ref_margin", False), ("drift", "drift", False),
                               ("soft", "ref_margin", False), ("error", "key", True)):
        g = df[df["class"] == cls].sort_values([by, "key"], ascending=[ascending, True], na_position="last")
        out.append(g.head(MAX_CASES[cls]))
    return pd.concat(out) if out else df.head(0)
