"""Escaping of untrusted text for each output format (report.html escapes with `html.escape`).

Text that reaches a report from a server (error bodies, finish reasons, incident log excerpts, server info)
or from a workload file (case ids, session ids, groups) is untrusted: it may hold newlines, Markdown or HTML
markup, control bytes or spreadsheet formulas. Each format gets its own function, applied where the text
is written, so no caller has to remember what its format needs.
"""

from __future__ import annotations

import re

# XML 1.0 allows tab, LF, CR and these ranges; anything else (C0 controls, lone surrogates, U+FFFE/U+FFFF) makes
# the whole document ill-formed, which a CI parser rejects.
_XML_INVALID = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]")
# inline Markdown (emphasis, code, links, tables, strikethrough), raw HTML and entities; block syntax (headings,
# lists) only acts at the start of a line, and md_inline never starts one
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&#])")
_MD_LINE_START = re.compile(r"^(\s*)([-+=]|\d+[.)])")  # a list item or setext underline if it began a line
CSV_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def visible_control(ch: str) -> str:
    """A control character as a visible escape, e.g. `\\x01`."""
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def xml_safe(text: object) -> str:
    """`text` with every character XML 1.0 forbids replaced by a visible escape (ElementTree escapes <, >, &)."""
    return _XML_INVALID.sub(lambda m: visible_control(m.group()), str(text))


def md_inline(text: object) -> str:
    """`text` as one line of literal Markdown text: control characters made visible, line breaks turned into
    spaces, and every character Markdown or HTML would interpret backslash-escaped."""
    s = _CONTROL.sub(lambda m: visible_control(m.group()), str(text))
    s = re.sub(r"[\r\n]+", " ", s)
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return _MD_LINE_START.sub(lambda m: m.group(1) + "\\" + m.group(2), s)


def md_code_text(text: object) -> str:
    """Text for a Markdown code span: one line, control characters made visible (the span keeps markup
    literal, but a line break inside it could start a heading or end the list item)."""
    s = _CONTROL.sub(lambda m: visible_control(m.group()), str(text))
    return re.sub(r"[\r\n]+", " ", s)


def md_block_line(text: object) -> str:
    """One line of a fenced code block: control characters made visible (the fence keeps markup literal)."""
    return _CONTROL.sub(lambda m: visible_control(m.group()), str(text))


def csv_cell(value: object) -> object:
    """A string cell that a spreadsheet would run as a formula gets a leading quote; other values unchanged."""
    if isinstance(value, str) and value.startswith(CSV_FORMULA):
        return "'" + value
    return value
