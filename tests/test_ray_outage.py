"""A whole Ray cluster lost mid-campaign: the run stops resumably, and resumes on a new cluster.

Before, losing the cluster was a worker_lost like a single dead node: the retry's first Ray call
waited a minute for the head and then Ray ended the driver process, with no RUN_END and the
tasks left running. Now a lost worker whose head refuses connections waits for the verdict;
once the head has refused for ``lost_after_s`` the run cancels its tasks (pending again, not
blocked), ends ``stopped`` with exit code 75, and `ftl campaign resume` on a new cluster
completes every task exactly once.

Its own single-node clusters, from Ray's own test helper (`ray.cluster_utils.Cluster`): the
outage kills the head's processes with SIGKILL, raylet first, as ``ray stop --force`` does, but
only this cluster's (``ray stop`` stops every Ray process on the machine, and waits seconds
for each group of them).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")

from ray.cluster_utils import Cluster  # noqa: E402

from test_ray_executor import (FTL, _events, _integrated_once, _plan, _replay_holds,  # noqa: E402
                               _repo, _task, _wait_for)


def _start_cluster() -> Cluster:
    """A single node (the head) with 2 CPUs."""
    return Cluster(initialize_head=True, head_node_args={"num_cpus": 2,
                                                         "include_dashboard": False})


def _lose(cluster: Cluster) -> None:
    """The whole cluster goes (SIGKILL, raylet first): its head refuses connections after."""
    if cluster.head_node is not None:
        cluster.remove_node(cluster.head_node, allow_graceful=False)
    cluster.shutdown()


def test_a_lost_cluster_stops_the_run_resumably_and_a_new_cluster_finishes_it(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    go = tmp_path / "go"  # absent in the first run: its tasks wait for the cluster to go
    tasks = [_task(1, f"test -e {go} || sleep 60; echo 1 > f1.txt"),
             _task(2, f"test -e {go} || sleep 60; echo 2 > f2.txt"),
             _task(3, "echo 3 > f3.txt", ["001"])]
    plan = _plan(tmp_path / "plan.json", tasks)
    config = tmp_path / "ftl.toml"  # a 1 s verdict instead of 15 s keeps the test short
    config.write_text("[executor]\nlost_after_s = 1\n")
    cluster = _start_cluster()
    address = cluster.address
    try:
        proc = subprocess.Popen([FTL, "campaign", "run", "--plan", str(plan), "--repo", str(repo),
                                 "--jobs", "2", "--executor", "ray", "--ray-address", address,
                                 "--config", str(config), "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(lambda: {e["task_seq"] for e in _events(repo) if e["event"] == "TASK_PLACED"}
                      >= {"001", "002"}, 120, "both tasks placed on the cluster")
            _lose(cluster)
            stopped_at = time.monotonic()
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
        # Nothing blocked. The loss ends the raylet before the head's GCS, so a first lost
        # worker can still meet a head that answers (a task's own loss: retried once); the
        # attempt that meets a refusing head waits for the verdict and ends cancelled.
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
        _lose(cluster)  # already lost, unless the test failed before

    go.write_text("")
    cluster = _start_cluster()
    try:
        resumed = subprocess.run([FTL, "campaign", "resume", "--repo", str(repo), "--executor", "ray",
                                  "--ray-address", cluster.address], capture_output=True,
                                 text=True, timeout=240)
    finally:
        _lose(cluster)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    _integrated_once(repo, ["001", "002", "003"])
    _replay_holds(repo)
