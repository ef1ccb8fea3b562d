"""The stdlib train/held-out split and the committed prompt text."""

from __future__ import annotations

import random

import pytest

from workloads.corpus import (
    HEADER,
    HELDOUT_MAX_BYTES,
    Document,
    TextCursor,
    TextSampler,
    build_heldout_text,
    heldout_documents,
    heldout_text,
    is_heldout,
    split_documents,
    stdlib_files,
)


def test_heldout_split_is_frozen():
    # The trainer excludes these files; the split must never move, or held-out prompts leak into training.
    expected = {
        "ast.py": True, "os.py": False, "typing.py": True, "json/__init__.py": False,
        "asyncio/taskgroups.py": True, "locale.py": True, "collections/__init__.py": False,
        "email/parser.py": True, "re/_parser.py": False, "random.py": False,
    }
    assert {name: is_heldout(name) for name in expected} == expected


def test_heldout_fraction_is_about_ten_percent():
    names = [f"pkg{i // 50}/mod{i}.py" for i in range(5000)]
    assert 400 <= sum(map(is_heldout, names)) <= 600


def _write(path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_stdlib_files_filters_and_sorts(tmp_path):
    _write(tmp_path / "zeta.py", b"z = 1\n")
    _write(tmp_path / "alpha.py", b"a = 1\n")
    _write(tmp_path / "pkg" / "mod.py", b"m = 1\n")
    _write(tmp_path / "pkg" / "notes.txt", b"not python\n")
    for skipped in ("test", "tests", "idlelib", "site-packages", "lib2to3"):
        _write(tmp_path / skipped / "x.py", b"x = 1\n")
    _write(tmp_path / "pkg" / "tests" / "y.py", b"y = 1\n")
    _write(tmp_path / "big.py", b"#" * 200_001)
    _write(tmp_path / "uni.py", "s = 'caf\u00e9'\n".encode())
    assert [rel for rel, _ in stdlib_files(tmp_path)] == ["alpha.py", "pkg/mod.py", "zeta.py"]


def test_stdlib_files_on_this_python():
    files = stdlib_files()
    rels = [rel for rel, _ in files]
    assert len(files) > 100 and rels == sorted(rels)
    assert "os.py" in rels and not any(rel.startswith(("test/", "idlelib/")) for rel in rels)


def test_build_heldout_text_keeps_only_heldout_files(tmp_path):
    names = [f"m{i}.py" for i in range(60)]
    for name in names:
        _write(tmp_path / name, f"# {name}\nx = 1\n".encode())
    text = build_heldout_text(stdlib_files(tmp_path))
    held = sorted(n for n in names if is_heldout(n))
    assert held  # the fixture needs at least one
    assert text == "".join(f"{HEADER}{n}\n# {n}\nx = 1\n" for n in held)


def test_committed_heldout_text():
    text = heldout_text()
    docs = heldout_documents()
    assert text.isascii() and len(text.encode()) <= HELDOUT_MAX_BYTES and text.startswith(HEADER)
    assert len(docs) >= 20 and all(is_heldout(d.relpath) for d in docs)
    assert "".join(f"{HEADER}{d.relpath}\n{d.text}" for d in docs) == text


def test_split_documents_round_trip_with_blank_line_endings():
    text = f"{HEADER}a.py\nx = 1\n\n\n{HEADER}b.py\ny = 2\n"
    assert split_documents(text) == [Document("a.py", "x = 1\n\n\n"), Document("b.py", "y = 2\n")]


def test_text_cursor_hands_out_exact_disjoint_line_start_slices():
    docs = [Document("a.py", "aaaa\nbbbb\n\ncccc\n"), Document("b.py", "dddd\neeee\n")]
    cursor = TextCursor(docs)
    assert [cursor.take(n) for n in (3, 4, 5, 3)] == ["aaa", "bbbb", "cccc\n", "ddd"]
    with pytest.raises(ValueError, match="no held-out document has 99"):
        cursor.take(99)


def test_text_sampler_is_seeded_and_exact():
    sampler = TextSampler(heldout_documents())
    a = [sampler.sample(random.Random(7), n) for n in (5, 300, 1000)]
    b = [sampler.sample(random.Random(7), n) for n in (5, 300, 1000)]
    assert a == b and [len(s) for s in a] == [5, 300, 1000]
    text = heldout_text()
    assert all(("\n" + s) in text or text.startswith(s) for s in a)  # each starts at a line start
