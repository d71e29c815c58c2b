"""Benchmark: how many tasks per second one ftl driver sustains on a Ray cluster (issue 14).

Starts a local Ray cluster (a head and a second node on 127.0.0.1, ``--cpus`` each), makes a
git repository and a plan of ``--tasks`` independent no-op tasks (run ``true``, verify ``true``:
each result is an empty commit, so only ftl's own work is measured), and runs it twice in the
same run, each as a fresh ``ftl campaign run`` process:

* ``ray``: ``--executor ray`` (attempts on the cluster, results carried back as bundles);
* ``local``: ``--executor local`` (the baseline: the same driver with attempts on its threads).

For each: wall time, tasks/s, the driver's CPU seconds (the ftl process and its tool server,
from ``wait4``'s rusage: Ray's workers are the raylets' children, not the driver's) and its
peak RSS. Ratios are against the local run.

Usage: ``python bench/bench_ray_driver.py [--tasks 2000] [--jobs 8] [--cpus 2] [--json]``.
Needs the ray extra (``pip install -e '.[ray]'``). Stops every Ray process of this machine at
the end (``ray stop --force``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cluster(cpus: int) -> str:
    port = _free_port()
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": True}
    subprocess.run([BIN / "ray", "start", "--head", "--node-ip-address=127.0.0.1",
                    f"--port={port}", f"--num-cpus={cpus}", "--include-dashboard=false",
                    "--disable-usage-stats"], **quiet)
    subprocess.run([BIN / "ray", "start", f"--address=127.0.0.1:{port}",
                    "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}",
                    "--disable-usage-stats"], **quiet)
    return f"127.0.0.1:{port}"


def _repo(root: Path, tasks: int) -> tuple[Path, Path]:
    repo = root / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=b", "-c", "user.email=b@b.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    (repo / "README").write_text("bench\n")
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=repo, check=True)
    plan = root / "plan.json"
    plan.write_text(json.dumps({"objective": "no-op tasks", "tasks": [
        {"seq": str(i), "slug": f"noop-{i}", "type": "BUILD", "delta": [f"n{i}.txt"],
         "run": "true", "verify": "true", "depends": []} for i in range(1, tasks + 1)]}))
    return repo, plan


def _run(executor: str, address: str, tasks: int, jobs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ftl-bench-ray-") as tmp:
        repo, plan = _repo(Path(tmp), tasks)
        argv = [str(BIN / "ftl"), "campaign", "run", "--plan", str(plan), "--repo", str(repo),
                "--jobs", str(jobs), "--executor", executor, "--json"]
        if executor == "ray":
            argv += ["--ray-address", address]
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        summary = json.loads(out)
        complete = summary.get("data", {}).get("complete")
        exit_code = os.waitstatus_to_exitcode(status)
        return {"executor": executor, "tasks": tasks, "jobs": jobs, "exit_code": exit_code,
                "complete": complete, "wall_s": round(wall, 2),
                "tasks_per_s": round(tasks / wall, 1),
                "driver_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                "driver_cpu_ms_per_task": round((usage.ru_utime + usage.ru_stime) * 1000 / tasks, 2),
                "driver_peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs each of the two nodes offers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    address = _cluster(args.cpus)
    try:
        rows = [_run("local", address, args.tasks, args.jobs),
                _run("ray", address, args.tasks, args.jobs)]
    finally:
        subprocess.run([BIN / "ray", "stop", "--force"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    base = rows[0]
    for row in rows:
        row["tasks_per_s_vs_local"] = round(row["tasks_per_s"] / base["tasks_per_s"], 2)
        row["driver_cpu_vs_local"] = round(row["driver_cpu_s"] / base["driver_cpu_s"], 2)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{args.tasks} no-op tasks, jobs {args.jobs}, two nodes x {args.cpus} CPUs, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'executor':<9}{'exit':>5}{'wall s':>9}{'tasks/s':>9}{'x local':>9}"
          f"{'driver cpu s':>14}{'ms/task':>9}{'peak MiB':>10}")
    for row in rows:
        print(f"{row['executor']:<9}{row['exit_code']:>5}{row['wall_s']:>9}{row['tasks_per_s']:>9}"
              f"{row['tasks_per_s_vs_local']:>9}{row['driver_cpu_s']:>14}"
              f"{row['driver_cpu_ms_per_task']:>9}{row['driver_peak_rss_mib']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
