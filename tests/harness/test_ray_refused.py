"""A local run on Ray (issue 27, smaller points): a run refused for too few resources leaves no run directory and
does not move runs/latest; a local Ray lives in a temporary directory of its own, removed after."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from harness.run import main
from tests.harness.helpers import make_sessions, run_args

pytestmark = pytest.mark.slow


def test_a_run_refused_for_too_few_cpus_leaves_no_run_directory(workdir, capsys):
    """c76ee7a: runs/refused stayed behind, empty, and runs/latest pointed at it."""
    pytest.importorskip("ray")
    runs = workdir / "runs"
    (runs / "old" / "records").mkdir(parents=True)
    (runs / "latest").symlink_to("old")
    rc = main(run_args(workdir, make_sessions(2), "--run-id", "refused", "--num-cpus", "1", "--startup-timeout", "5"))
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert ("the plan does not fit the Ray cluster, so nothing was started: it needs (i16, i32 x 2 + reference x 1 "
            "= 5 replicas) x TP 1 on CPU = 5 CPUs, each replica on one node; the cluster has 0 GPUs, 1 CPUs on 1 "
            "node(s)") in err
    assert f"specgate: removed {runs / 'refused'}: the run recorded nothing" in err
    assert sorted(p.name for p in runs.iterdir()) == ["latest", "old"]
    assert os.readlink(runs / "latest") == "old"
    assert "starting a local Ray" in out


def sigterm_caught() -> bool:
    """Whether this process catches SIGTERM, as the kernel sees it (Python's own view can be stale)."""
    mask = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("SigCgt:"))
    return bool(int(mask.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def test_a_local_ray_has_its_own_temp_directory_and_leaves_sigterm_to_the_harness(tmp_path):
    """The SIGTERM handler survives ray.init and ray.shutdown (c76ee7a: Ray's, then the OS default: exit -15)."""
    ray = pytest.importorskip("ray")
    from harness.ray_pools import RayPools
    from harness.targets import run_config
    from harness.targets.builtin import builtin_plan

    if ray.is_initialized():
        ray.shutdown()
    cfg = run_config(intervals=(16,), block_size=4, num_cpus=1)
    pools = RayPools(cfg, builtin_plan(cfg, make_sessions(1)), "tmpdir", launch=None)
    def ours(signum, frame) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, ours)
    try:
        pools.connect()
        assert signal.getsignal(signal.SIGTERM) is ours and sigterm_caught()
        session = Path(ray._private.worker._global_node.get_session_dir_path())
        assert pools.temp_dir and Path(pools.temp_dir).name.startswith("specgate-ray-")
        assert session.parent == Path(pools.temp_dir)  # not /tmp/ray, where any `ray start` leaves its address
    finally:
        pools.close()
        handler = signal.getsignal(signal.SIGTERM)
        caught = sigterm_caught()
        signal.signal(signal.SIGTERM, previous)
    assert not ray.is_initialized() and not Path(pools.temp_dir).exists()
    assert handler is ours and caught
