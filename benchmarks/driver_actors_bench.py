"""Driver actors (`--drivers N`): aggregate request rate and client CPU per request against an instant server.

The servers are benchmarks/driver_bench.py's: canned SGLang answers streamed without a model, each in a child
process of its own (`--servers` of them, one replica each, sessions spread over them by their index). The
same closed-loop sweep point (`--concurrency` in flight in all, split over the actors) is driven by the single
in-process driver, then by 1, 2 and 4 driver actors on a local Ray (harness/driver_actors.py; every actor
records its own journals, references are shared through the registry actor). Each row prints the candidate
requests per second (each also has its reference request: the HTTP requests are twice that), and the client
CPU per candidate request: the head process plus every actor process (each shown too), from the point's start
to the last record (Ray's own threads in those processes included; the servers and Ray's daemons not). Each
row shows its best rate and its least CPU over `--repeat` runs (the machine is noisy).

What a row can reach is bounded by the machine's cores: on a 2-core machine the servers, the actors and Ray
share two cores, so more actors cannot add cores and the rate stays flat or falls (the script says so).

    python benchmarks/driver_actors_bench.py --requests 2000 --concurrency 64 --drivers 1,2,4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import tempfile
import time
from pathlib import Path

import aiohttp
from driver_bench import serve_forever, sessions

from harness.driver import Driver
from harness.driver_actors import ActorDriver, actor_spec
from harness.pools import Pool, Replica
from harness.progress import Progress
from harness.targets import run_config
from harness.targets.builtin import candidate_engine, reference_engine
from records.jsonl import RecordFiles


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _wait_healthy(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as http:
        for url in urls:
            for _ in range(200):
                try:
                    async with http.get(url + "/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)


async def one_row(urls: list[str], args: argparse.Namespace, drivers: int | None
                  ) -> tuple[int, float, float, float]:
    """One closed-loop point; `drivers`: None for the in-process driver, else that many actors. Returns
    (candidate requests, wall s, the head's CPU s, the actors' CPU s)."""
    cfg = run_config(intervals=(256,))
    work = sessions(args.requests, args.prompt_len, args.max_new_tokens)
    cand = Pool("i256", "candidate", candidate_engine(cfg, 256),
                [Replica(f"i256-r{k}", u) for k, u in enumerate(urls)], True, 5.0)
    ref = Pool("reference", "reference", reference_engine(cfg),
               [Replica(f"reference-r{k}", u) for k, u in enumerate(urls)], True, 5.0)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        (run_dir / "config.json").write_text("{}")
        files = RecordFiles(run_dir, set())
        progress = Progress(0, 0, enabled=False)
        progress.write = lambda line: None
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            kwargs = dict(run_id="bench", concurrency=(args.concurrency,), candidates=[cand], reference=ref,
                          files=files, http=http, progress=progress, reference_concurrency=args.concurrency,
                          windows=False)
            group = {"i256": tuple(work)}
            if drivers is None:
                driver: Driver = Driver(**kwargs)
                cpu0, t0 = time.process_time(), time.perf_counter()
                await driver.run(group)
                wall, cpu, actors = time.perf_counter() - t0, time.process_time() - cpu0, 0.0
            else:
                # the actors' head for every count (make_driver keeps 1 in this process)
                driver = ActorDriver(drivers=drivers, run_dir=run_dir, spec=actor_spec(drivers, run_dir, kwargs),
                                     **kwargs)
                remote = driver.remote
                await remote.start({**driver.spec, "sessions": group, "recorded": {}, "io": {}, "answered": {}})
                actors0 = sum(await asyncio.gather(*(a.cpu.remote() for a in remote.actors)))
                cpu0, t0 = time.process_time(), time.perf_counter()
                await driver._pools(group)
                await remote.finish()
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                actors = sum(await asyncio.gather(*(a.cpu.remote() for a in remote.actors))) - actors0
                remote.close()
            done = progress.done
        files.close()
    return done, wall, cpu, actors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000, help="candidate requests (each also has a reference)")
    p.add_argument("--concurrency", type=int, default=64, help="in flight in all, split over the actors")
    p.add_argument("--drivers", default="1,2,4", help="driver actor counts, one row each")
    p.add_argument("--servers", type=int, default=2, help="instant server processes (replicas)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--repeat", type=int, default=2, help="runs per row; the best rate and least CPU are shown")
    args = p.parse_args()
    import ray

    ports = [_free_port() for _ in range(args.servers)]
    procs = [multiprocessing.Process(target=serve_forever, args=(port,), daemon=True) for port in ports]
    for proc in procs:
        proc.start()
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    asyncio.run(_wait_healthy(urls))
    counts = [int(x) for x in args.drivers.split(",")]
    ray.init(num_cpus=max(8, max(counts) + 2), include_dashboard=False, log_to_driver=False)
    print(f"machine: {os.cpu_count()} cores; {args.servers} instant server process(es); closed loop, "
          f"{args.concurrency} in flight in all; {args.requests} candidate requests (+ as many references)")
    rows = []
    for label, n in [("in-process driver", None)] + [(f"{n} driver actor(s)", n) for n in counts]:
        runs = [asyncio.run(one_row(urls, args, n)) for _ in range(args.repeat)]
        done, _, head, actors = min(runs, key=lambda r: (r[2] + r[3]) / r[0])  # the least CPU: closest to the cost
        best = (max(r[0] / r[1] for r in runs), (head + actors) / done * 1e3, head / done * 1e3, actors / done * 1e3)
        rows.append({"driver": label, "requests_per_s": round(best[0], 1), "cpu_ms_per_request": round(best[1], 3),
                     "head_ms": round(best[2], 3), "actors_ms": round(best[3], 3)})
        print(f"{label:>20}: {best[0]:8.1f} candidate requests/s, client CPU {best[1]:.3f} ms per request "
              f"(head {best[2]:.3f}, actors {best[3]:.3f})", flush=True)
    base = next((r for r in rows if r["driver"].startswith("1 driver")), rows[0])
    for r in rows[1:]:
        print(f"{r['driver']:>20}: {r['requests_per_s'] / base['requests_per_s']:.2f}x the rate of 1 actor")
    if (os.cpu_count() or 1) < 2 * max(counts) + args.servers:
        print(f"note: {os.cpu_count()} cores cannot run {max(counts)} actors, their Ray threads and "
              f"{args.servers} server(s) at once: the rows show what this machine allows, not the scaling")
    print(json.dumps(rows))
    ray.shutdown()
    for proc in procs:
        proc.terminate()


if __name__ == "__main__":
    main()
