"""Reading and validating workload JSONL files (the schema is in workloads/README.md).

Every problem is a WorkloadError whose message names the file, the line and the
field, e.g. `my.jsonl:7: field 'turns[1].max_new_tokens': must be a positive integer`.
Text is encoded, and ids are checked, with the target's tokenizer (default: the
built-in byte tokenizer).
"""

from __future__ import annotations

import json
from pathlib import Path

from protocol.tokenizer import BYTE_TOKENIZER, NUM_BYTES, Tokenizer
from workloads.schema import CONTEXT_TOKENS, SESSION_FIELDS, TURN_FIELDS, Session, Turn, WorkloadError


class _Line:
    """Where a value came from, to name it in errors."""

    def __init__(self, name: str, lineno: int, tokenizer: Tokenizer | None = BYTE_TOKENIZER) -> None:
        self.name = name
        self.lineno = lineno
        self.tokenizer = tokenizer

    def fail(self, field: str | None, problem: str) -> WorkloadError:
        where = f"{self.name}:{self.lineno}: " + (f"field '{field}': " if field else "")
        return WorkloadError(where + problem, path=self.name, line=self.lineno, field=field)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ids(line: _Line, field: str, value: object, *, allow_empty: bool) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise line.fail(field, f"must be a list of token ids, got {type(value).__name__}")
    if not value and not allow_empty:
        raise line.fail(field, "must not be empty")
    for i, t in enumerate(value):
        if not _is_int(t):
            raise line.fail(f"{field}[{i}]", f"must be an integer token id, got {json.dumps(t)}")
        vocab = line.tokenizer.vocab_size if line.tokenizer is not None else None
        if t < 0 or vocab is not None and t >= vocab:
            if vocab is None:
                raise line.fail(f"{field}[{i}]", f"token id {t} is negative")
            raise line.fail(f"{field}[{i}]", f"token id {t} is outside the vocabulary 0..{vocab - 1}"
                            + ("" if line.tokenizer.name == "byte" else f" of tokenizer {line.tokenizer.name}"))
    return tuple(value)


def _text_of(ids: tuple[int, ...], tokenizer: Tokenizer | None) -> str | None:
    """The text of `ids`: for the byte tokenizer only when they are valid UTF-8 bytes (else None); for other
    tokenizers their decoding (special tokens dropped), None when it fails or there is no tokenizer."""
    if tokenizer is None:
        return None
    if tokenizer.name != "byte":
        try:
            return tokenizer.decode(ids)
        except ValueError:
            return None
    if any(t >= NUM_BYTES for t in ids):
        return None
    try:
        return bytes(ids).decode("utf-8")
    except UnicodeDecodeError:
        return None


def _ids_and_text(line: _Line, obj: dict, prefix: str, ids_key: str, text_key: str, *,
                  allow_empty: bool) -> tuple[tuple[int, ...], str | None]:
    """The ids and text of a prompt or suffix: either may be given; both must agree."""
    text = obj.get(text_key)
    if text is not None and not isinstance(text, str):
        raise line.fail(prefix + text_key, f"must be a string, got {type(text).__name__}")
    if obj.get(ids_key) is None:
        if text is None:
            raise line.fail(prefix + ids_key, f"missing: give '{ids_key}' or '{text_key}'")
        if line.tokenizer is None:
            raise line.fail(prefix + text_key, f"encoding text needs the target's tokenizer: pass --tokenizer (or "
                            f"give '{ids_key}')")
        ids = tuple(line.tokenizer.encode(text))
        if not ids and not allow_empty:
            raise line.fail(prefix + text_key, "must not be empty")
        return ids, text
    ids = _ids(line, prefix + ids_key, obj[ids_key], allow_empty=allow_empty)
    if text is None:
        return ids, _text_of(ids, line.tokenizer)
    if line.tokenizer is None:  # nothing to check the text against: ids and text are taken as given
        return ids, text
    encoded = tuple(line.tokenizer.encode(text))
    if encoded != ids and _text_of(ids, line.tokenizer) != text:  # BPE: ids need not be text's canonical encoding
        pairs = enumerate(zip(ids, encoded, strict=False))
        at = next((i for i, (a, b) in pairs if a != b), min(len(ids), len(encoded)))
        raise line.fail(prefix + ids_key, f"does not match the tokenizer's encoding of '{text_key}' "
                        f"({len(ids)} ids vs {len(encoded)}; first difference at index {at})")
    return ids, text


def parse_turn(line: _Line, obj: object, index: int) -> Turn:
    """One turn from its JSON form."""
    prefix = f"turns[{index}]."
    if not isinstance(obj, dict):
        raise line.fail(f"turns[{index}]", f"must be an object, got {type(obj).__name__}")
    for key in obj:
        if key not in TURN_FIELDS:
            raise line.fail(prefix + key, f"unknown field (allowed: {', '.join(TURN_FIELDS)})")
    if "max_new_tokens" not in obj:
        raise line.fail(prefix + "max_new_tokens", "missing")
    max_new = obj["max_new_tokens"]
    if not _is_int(max_new) or max_new <= 0:
        raise line.fail(prefix + "max_new_tokens", f"must be a positive integer, got {json.dumps(max_new)}")
    if index == 0:
        for key in ("suffix_ids", "suffix_text", "branch_at"):
            if key in obj:
                raise line.fail(prefix + key, "turn 0 carries the prompt in 'input_ids'/'text', not a suffix "
                                "or a branch point")
        ids, text = _ids_and_text(line, obj, prefix, "input_ids", "text", allow_empty=False)
        return Turn(max_new_tokens=max_new, input_ids=ids, text=text)
    for key in ("input_ids", "text"):
        if key in obj:
            raise line.fail(prefix + key,
                            "only turn 0 has a prompt; later turns give 'suffix_ids'/'suffix_text'")
    ids, text = _ids_and_text(line, obj, prefix, "suffix_ids", "suffix_text", allow_empty=True)
    branch_at = obj.get("branch_at")
    if branch_at is not None and (not _is_int(branch_at) or branch_at < 0):
        raise line.fail(prefix + "branch_at", f"must be a non-negative integer (tokens of the previous turn's "
                        f"input and output to keep), got {json.dumps(branch_at)}")
    return Turn(max_new_tokens=max_new, suffix_ids=ids, suffix_text=text, branch_at=branch_at)


def _optional_str(line: _Line, obj: dict, key: str, default: str, *, allow_empty: bool = True) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str) or (not value and not allow_empty):
        kind = "string" if allow_empty else "non-empty string"
        raise line.fail(key, f"must be a {kind}, got {json.dumps(value)}")
    return value


def parse_session(line: _Line, obj: object, *, default_suite: str) -> Session:
    """One session from its JSON form (optional fields take their defaults)."""
    if not isinstance(obj, dict):
        raise line.fail(None, f"expected a JSON object (one session per line), got {type(obj).__name__}")
    for key in obj:
        if key not in SESSION_FIELDS:
            raise line.fail(key, f"unknown field (allowed: {', '.join(SESSION_FIELDS)})")
    if "session_id" not in obj:
        raise line.fail("session_id", "missing")
    session_id = _optional_str(line, obj, "session_id", "", allow_empty=False)
    interval = obj.get("interval")
    if interval is not None and (not _is_int(interval) or interval <= 0):
        raise line.fail("interval", f"must be a positive integer or null, got {json.dumps(interval)}")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict):
        raise line.fail("meta", f"must be an object, got {type(meta).__name__}")
    if "turns" not in obj:
        raise line.fail("turns", "missing")
    turns = obj["turns"]
    if not isinstance(turns, list) or not turns:
        raise line.fail("turns", "must be a non-empty list of turns")
    return Session(
        session_id=session_id,
        suite=_optional_str(line, obj, "suite", default_suite, allow_empty=False),
        interval=interval,
        group=_optional_str(line, obj, "group", "user"),
        targets=_optional_str(line, obj, "targets", ""),
        meta=meta,
        turns=tuple(parse_turn(line, t, i) for i, t in enumerate(turns)),
    )


def parse_jsonl(text: str, *, name: str, default_suite: str, max_context: int | None = CONTEXT_TOKENS,
                tokenizer: Tokenizer | None = BYTE_TOKENIZER) -> list[Session]:
    """Sessions of a JSONL text (blank lines skipped); `name` is used in error messages; `text` fields are
    encoded and ids checked with `tokenizer`."""
    sessions: list[Session] = []
    first_line: dict[str, int] = {}
    for lineno, raw in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit in a string
        if not raw.strip():
            continue
        line = _Line(name, lineno, tokenizer)
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise line.fail(None, f"invalid JSON: {e.msg} (column {e.colno})") from None
        session = parse_session(line, obj, default_suite=default_suite)
        if session.session_id in first_line:
            raise line.fail("session_id", f"duplicate {session.session_id!r} (first on line "
                            f"{first_line[session.session_id]})")
        first_line[session.session_id] = lineno
        if max_context is not None and session.max_total_tokens() > max_context:
            raise line.fail("turns", f"the session can reach {session.max_total_tokens()} tokens "
                            f"(prompt + suffixes + max_new_tokens), over the {max_context}-token context")
        sessions.append(session)
    if not sessions:
        raise WorkloadError(f"{name}: no sessions (expected one JSON object per line)", path=name)
    return sessions


def validate_file(path: str | Path, *, max_context: int | None = CONTEXT_TOKENS,
                  tokenizer: Tokenizer | None = BYTE_TOKENIZER) -> list[Session]:
    """Read and check a workload JSONL file (text and ids in `tokenizer`); the default suite is the file's stem."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror}", path=str(path)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        lineno = data[: e.start].count(b"\n") + 1
        raise _Line(path.name, lineno).fail(None, "not valid UTF-8") from None
    return parse_jsonl(text, name=path.name, default_suite=path.stem, max_context=max_context,
                       tokenizer=tokenizer)
