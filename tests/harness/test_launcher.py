"""The replica launcher: PR_SET_PDEATHSIG and --reference-nice applied before the server's exec."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.replica import _LAUNCHER

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launcher is Linux-only")
SHOW = "import os; print(os.nice(0), os.environ.get('SPECGATE_NICE'))"


@pytest.mark.parametrize("nice", ["0", "3"])
def test_launcher_adds_the_niceness_and_hides_the_variable(nice):
    env = dict(os.environ, SPECGATE_NICE=nice)
    launch = [sys.executable, "-c", _LAUNCHER, str(os.getpid()), sys.executable, "-c", SHOW]
    out = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=30, check=True).stdout.split()
    assert out == [str(min(19, os.nice(0) + int(nice))), "None"]


def test_launcher_refuses_a_parent_that_is_not_its_starter():
    launch = [sys.executable, "-c", _LAUNCHER, "1", sys.executable, "-c", SHOW]
    assert subprocess.run(launch, capture_output=True, timeout=30).returncode == 1


SERVER = """
import ctypes, os, signal, sys, time
ctypes.CDLL(None).prctl(1, 0)  # no death signal will come (another OS, a pid namespace): the watchdog alone
signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1] + '.term', 'w').close(), os._exit(0)))
open(sys.argv[1], 'w').write(str(os.getpid()))
while True:
    time.sleep(0.1)
"""
ACTOR = "import os, subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid()), " \
        "*sys.argv[2:]])\ntime.sleep(120)\n"


def _wait_for(path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_watchdog_ends_a_server_no_death_signal_reached_once_its_actor_is_gone(tmp_path):
    (tmp_path / "server.py").write_text(SERVER)
    pidfile = tmp_path / "server.pid"
    actor = subprocess.Popen([sys.executable, "-c", ACTOR, _LAUNCHER, sys.executable, str(tmp_path / "server.py"),
                              str(pidfile)])
    try:
        assert _wait_for(pidfile, 30), "the server did not start"
        time.sleep(0.3)  # the pid file is written before its content is flushed by close
        server = int(pidfile.read_text())
        assert server != actor.pid
        assert not (tmp_path / "server.pid.term").exists()
        actor.kill()  # SIGKILL: the actor's pid goes away and no signal reaches the server
        actor.wait()
        assert _wait_for(tmp_path / "server.pid.term", 20), "the watchdog did not SIGTERM the server"
    finally:
        actor.kill()
        if pidfile.exists() and pidfile.read_text():
            try:
                os.kill(int(pidfile.read_text()), 9)
            except ProcessLookupError:
                pass
