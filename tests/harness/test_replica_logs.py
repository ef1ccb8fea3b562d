"""What an incident quotes from a replica's log: the first lines of the crash."""

from __future__ import annotations

import os
import time

import pytest

from harness.replica import crash_excerpt, previous_log, read_log_excerpt

LOG = """2026-01-01 INFO specgate.serve: ready
specgate engine serving on http://127.0.0.1:1234
Traceback (most recent call last):
  File "engine/server/async_engine.py", line 250, in _loop
RuntimeError: test fault: the engine loop raised at step 61
2026-01-01 ERROR specgate.serve: engine died (engine loop failed: ...): exiting with status 3
"""


@pytest.mark.parametrize("text,first,lines", [
    (LOG, "Traceback (most recent call last):", 4),  # from the first traceback on
    ("a\nb\nengine died (rank 1)\nc\n", "engine died (rank 1)", 2),
    ("x\nerror: cannot listen on 127.0.0.1:80\n", "error: cannot listen on 127.0.0.1:80", 1),
    ("one\ntwo\n", "one", 2),  # no crash marker: the last lines
])
def test_crash_excerpt_starts_at_the_crash(text, first, lines):
    got = crash_excerpt(text)
    assert got.splitlines()[0] == first and len(got.splitlines()) == lines


def test_crash_excerpt_of_nothing_is_none(tmp_path):
    assert crash_excerpt("") is None and crash_excerpt("\n \n") is None
    assert read_log_excerpt(str(tmp_path / "missing.log")) is None


def test_previous_log_is_the_newest_of_this_replica(tmp_path):
    for name, age in (("i16-r0-1.log", 30), ("i16-r0-2.log", 10), ("i16-r01-3.log", 0), ("i16-r1-4.log", 0)):
        (tmp_path / name).write_text(name)
        os.utime(tmp_path / name, (time.time() - age, time.time() - age))
    assert previous_log(tmp_path, "i16-r0").name == "i16-r0-2.log"
    assert previous_log(tmp_path, "i32-r0") is None
