"""A whole Ray cluster lost mid-campaign: the run stops resumably, and resumes on a new cluster.

Before, losing the cluster was a worker_lost like a single dead node: the retry's first Ray call
waited a minute for the head and then Ray ended the driver process, with no RUN_END and the
tasks left running. Now a lost worker whose head refuses connections waits for the verdict;
once the head has refused for ``lost_after_s`` the run cancels its tasks (pending again, not
blocked), ends ``stopped`` with exit code 75, and `ftl campaign resume` on a new cluster
completes every task exactly once.

Its own single-node cluster (this module runs after test_ray_executor.py, whose cluster is
stopped by then): stopping a cluster stops every Ray process on the machine.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")

from test_ray_executor import (FTL, RAY, _events, _free_port, _integrated_once, _plan,  # noqa: E402
                               _ray, _replay_holds, _repo, _task, _wait_for)


def _start_head() -> str:
    port = _free_port()
    _ray("start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats")
    return f"127.0.0.1:{port}"


def _stop_all() -> None:
    subprocess.run([RAY, "stop", "--force"], timeout=120, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def test_a_lost_cluster_stops_the_run_resumably_and_a_new_cluster_finishes_it(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    go = tmp_path / "go"  # absent in the first run: its tasks wait for the cluster to go
    tasks = [_task(1, f"test -e {go} || sleep 60; echo 1 > f1.txt"),
             _task(2, f"test -e {go} || sleep 60; echo 2 > f2.txt"),
             _task(3, "echo 3 > f3.txt", ["001"])]
    plan = _plan(tmp_path / "plan.json", tasks)
    config = tmp_path / "ftl.toml"  # a 1 s verdict instead of 15 s keeps the test short
    config.write_text("[executor]\nlost_after_s = 1\n")
    address = _start_head()
    stopped = False  # `ray stop` takes seconds even with nothing to stop: once is enough
    try:
        proc = subprocess.Popen([FTL, "campaign", "run", "--plan", str(plan), "--repo", str(repo),
                                 "--jobs", "2", "--executor", "ray", "--ray-address", address,
                                 "--config", str(config), "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(lambda: {e["task_seq"] for e in _events(repo) if e["event"] == "TASK_PLACED"}
                      >= {"001", "002"}, 120, "both tasks placed on the cluster")
            _stop_all()
            stopped, stopped_at = True, time.monotonic()
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        # Stopped promptly (Ray's own reconnection would wait 60 s, then end the process).
        assert time.monotonic() - stopped_at < 45, err[-2000:]
        assert proc.returncode == 75, out[-2000:] + err[-2000:]
        envelope = json.loads(out)
        assert envelope["success"] is False
        assert envelope["data"]["ftl_error_type"] == "cluster_lost" and envelope["data"]["exit_code"] == 75
        assert envelope["error"].startswith(f"The Ray cluster at {address} was lost")
        assert "ftl campaign resume" in envelope["data"]["summary"]["message"]
        assert "ftl campaign resume" in envelope["data"]["remediation"]  # not "retried once"
        events = _events(repo)
        end = [e for e in events if e["event"] == "RUN_END"]
        assert [(e["outcome"], e["resumable"], e["exit_code"]) for e in end] == [("stopped", True, 75)]
        ended = {e["task_seq"]: e["status"] for e in events if e["event"] == "TASK_END"}
        assert ended == {"001": "cancelled", "002": "cancelled"}, ended
        # Nothing blocked. `ray stop` ends the node before the head, so a first lost worker can
        # still meet a head that answers (a task's own loss: retried once); the attempt that
        # meets a refusing head waits for the verdict and ends cancelled.
        failures = [e for e in events if e["event"] == "TOOL_FAILURE"]
        last = {e["task_seq"]: e["error_type"] for e in failures}
        assert last == {"001": "cancelled", "002": "cancelled"}, failures
        assert {e["error_type"] for e in failures} <= {"worker_lost", "cancelled"}
        assert not [e for e in events if e["event"] == "TASK_BLOCKED"]
        status = subprocess.run([FTL, "campaign", "status", "--repo", str(repo), "--json"],
                                capture_output=True, text=True, timeout=60)
        rows = {t["seq"]: t["status"] for t in json.loads(status.stdout)["data"]["tasks"]}
        assert rows == {"001": "pending", "002": "pending", "003": "pending"}, rows
    finally:
        if not stopped:
            _stop_all()

    go.write_text("")
    address = _start_head()
    try:
        resumed = subprocess.run([FTL, "campaign", "resume", "--repo", str(repo), "--executor", "ray",
                                  "--ray-address", address], capture_output=True, text=True,
                                 timeout=240)
    finally:
        _stop_all()
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    _integrated_once(repo, ["001", "002", "003"])
    _replay_holds(repo)
