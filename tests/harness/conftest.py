"""Fixtures of the harness tests: a shared local Ray and a working directory for runs."""

from __future__ import annotations

import pytest

from tests.harness.helpers import REPO


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    # "local": a Ray of its own, never a cluster another test (another pytest-xdist worker) has started
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # replicas run `python -m tests.harness.fake_server` from the driver's cwd
    (tmp_path / "pids").mkdir()
    return tmp_path
