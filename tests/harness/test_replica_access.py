"""Built-in replicas are not open to the network (issue 18, finding 3 and 7).

* A harness run on a local Ray: the replicas listen on 127.0.0.1 only, require the run's random API
  key, and that key is in no process's command line (/proc/*/cmdline) - only in the servers' environment.
* A replica bound to the node's own non-loopback address (as on a multi-node cluster) rejects
  unauthenticated requests there. Without a non-loopback address on this machine the same checks run
  against the node address Ray reports (then 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.run import main
from reports.gate import EXIT_INCONCLUSIVE
from tests.harness.helpers import check_complete, make_sessions, write_workload
from tests.netaddr import outside_address

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
BODY = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}).encode()


def post_generate(url: str, key: str | None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"{url}/generate", BODY, headers), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def ready(url: str, key: str) -> bool:
    try:
        return post_generate(url, key) == 200
    except urllib.error.URLError:
        return False


def processes() -> dict[int, tuple[bytes, bytes]]:
    """pid -> (cmdline, environ) of every process we may read."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = ((d / "cmdline").read_bytes(), (d / "environ").read_bytes())
            except OSError:
                continue
    return out


def serving_replicas(run_id: str) -> list[tuple[int, list[str], str]]:
    """(pid, argv, API key from its environment) of each engine.serve of run `run_id` (its stdout is the replica
    log in /tmp/specgate/RUN_ID/; other servers on a shared machine are not ours)."""
    found = []
    for pid, (cmdline, environ) in processes().items():
        argv = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
        try:
            ours = f"/specgate/{run_id}/" in os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            ours = False
        if ours and "engine.serve" in argv and "--port" in argv:
            env = dict(kv.decode(errors="replace").split("=", 1) for kv in environ.split(b"\0") if b"=" in kv)
            found.append((pid, argv, env.get("SPECGATE_API_KEY", "")))
    return found


def test_a_local_run_keeps_its_replicas_on_loopback_behind_a_key_no_command_line_shows(ray_local, workdir):
    sessions = make_sessions(4, prompt_len=24, max_new=30)
    workload = write_workload(workdir / "w.jsonl", sessions)
    result: dict = {}
    run_id = f"access-{secrets.token_hex(4)}"
    args = ["--suite", str(workload), "--model-path", "random", "--model-preset", "tiny", "--intervals", "16",
            "--block-size", "4", "--concurrency", "1,2", "--runs-dir", str(workdir / "runs"), "--run-id", run_id,
            "--no-progress", "--startup-timeout", "120", "--max-soft-rate", "1"]
    t = threading.Thread(target=lambda: result.setdefault("rc", main(args)))
    t.start()
    deadline = time.monotonic() + 120
    replicas = []
    while len(replicas) < 2:  # the candidate and the reference server
        assert time.monotonic() < deadline and t.is_alive(), "no replica servers appeared"
        time.sleep(0.2)
        replicas = serving_replicas(run_id)
    keys = {key for _, _, key in replicas}
    assert len(keys) == 1 and len(next(iter(keys))) >= 32  # one random per-run key, in their environment
    key = keys.pop()
    on_cmdline = [pid for pid, (cmdline, _) in processes().items() if key.encode() in cmdline]
    assert on_cmdline == [], f"the API key is on the command line of {on_cmdline}"
    outside = outside_address()
    for _pid, argv, _ in replicas:
        host, port = argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]
        assert host == "127.0.0.1"
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not ready(url, key):  # it may still be loading
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert post_generate(url, None) == 401 and post_generate(url, "wrong") == 401
        if outside is not None:
            with pytest.raises(urllib.error.URLError):
                post_generate(f"http://{outside}:{port}", key)
    t.join(240)
    # INCONCLUSIVE (exit 3), not PASS: so few short turns exercise too little (reports/exercised.py)
    assert result["rc"] == EXIT_INCONCLUSIVE
    check_complete(workdir / "runs" / run_id, sessions, intervals=(16,))
    print(f"replica argv: {replicas[0][1][2:]}\nkey only in their environment; outside address {outside}: refused")


def test_a_replica_on_the_node_address_rejects_unauthenticated_requests(ray_local, tmp_path):
    ray = pytest.importorskip("ray")
    from harness.replica import ReplicaServer

    key = secrets.token_urlsafe(32)
    actor = ray.remote(max_restarts=0, num_cpus=1)(ReplicaServer).remote(
        "access-r0", ["--model-path", "random", "--model-preset", "tiny"], None, os.getcwd(), 120.0,
        str(tmp_path), {"model_path": "random", "model_preset": "tiny"}, key, "node")
    try:
        info = ray.get(actor.info.remote(), timeout=180)
        url = info["url"]
        host = url.split("//")[1].rsplit(":", 1)[0]
        print(f"replica bound to the node address: {url} (this machine's outside address: {outside_address()})")
        if outside_address() is not None:
            assert host == outside_address() and not host.startswith("127.")
        assert post_generate(url, None) == 401
        assert post_generate(url, "not-the-key") == 401
        assert post_generate(url, key) == 200
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:  # /health stays open for probes
            assert r.status == 200
        cmdline = Path(f"/proc/{info['pid']}/cmdline").read_bytes()
        assert key.encode() not in cmdline and b"--api-key" not in cmdline
    finally:
        ray.get(actor.stop.remote(), timeout=60)
        ray.kill(actor)
