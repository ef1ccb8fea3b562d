"""The replica launcher: PR_SET_PDEATHSIG and --reference-nice applied before the server's exec."""

from __future__ import annotations

import os
import subprocess
import sys

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
