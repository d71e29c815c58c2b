"""A Ray cluster whose head answers while every node that can run work is gone.

The common layout: a head that runs no tasks (``--num-cpus=0``) and worker nodes that do. When
every worker dies (spot instances preempted, a rack lost) the head still accepts connections,
so probing it says nothing. Before, the running attempts failed ``worker_lost``, their retries
then waited in Ray's queue with no deadline (a queued attempt's time is not the task's): the
run hung. Now the driver reads the nodes while the head answers; no live node with CPUs for
``lost_after_s`` marks the cluster lost, and the run stops resumably (every task pending, none
blocked). A node that joins in time resets that clock: the run goes on. A cluster that has no
node with CPUs when the run starts stops it the same way (before: each task blocked as a
``configuration_error``).

Real multi-node clusters on this machine, from Ray's own test helper
(`ray.cluster_utils.Cluster`): a 0-CPU head and a 2-CPU worker node, removed with SIGKILL (no
graceful goodbye to the head, as with a preempted machine). The module shares one head (a head
starts in seconds); each test adds its own worker nodes, and they are removed after it, so
every test starts with a head that has seen them go and has no node with CPUs.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="needs the ray extra: pip install -e '.[ray]'")

from ray.cluster_utils import Cluster  # noqa: E402

from ftl.executors.ray_cluster import NODES_EVERY_S, WATCH_S  # noqa: E402
from test_ray_executor import (FTL, _events, _integrated_once, _plan, _repo,  # noqa: E402
                               _replay_holds, _task, _wait_for)

# The head declares a dead node after ~1.5 s instead of Ray's default ~15-30 s, so the tests
# stay short; the driver's logic does not depend on how fast the head notices.
_FAST_DEATH = {"health_check_initial_delay_ms": 500, "health_check_period_ms": 500,
               "health_check_timeout_ms": 500, "health_check_failure_threshold": 3}


def _cluster() -> tuple[Cluster, object]:
    """A 0-CPU head and one 2-CPU worker node: ``(cluster, worker node)``."""
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        "_system_config": _FAST_DEATH})
    try:
        worker = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
    except BaseException:
        cluster.shutdown()
        raise
    return cluster, worker


@pytest.fixture(scope="module")
def head() -> Cluster:
    """The module's 0-CPU head, with no worker node between tests (see `cluster`)."""
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        "_system_config": _FAST_DEATH})
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def cluster(head: Cluster) -> tuple[Cluster, object]:
    """`head` with a 2-CPU worker node of this test's own: ``(cluster, worker node)``. After
    the test, every worker node it added is removed (SIGKILL, also one already dead) and the
    head has marked them dead, so the next test meets a head with no node with CPUs."""
    try:
        worker = head.add_node(num_cpus=2)
        head.wait_for_nodes()
        yield head, worker
    finally:
        for node in list(head.worker_nodes):
            head.remove_node(node, allow_graceful=False)
        head.wait_for_nodes()


def _run(repo: Path, plan: Path, address: str, config: Path, stderr: Path,
         jobs: int = 2) -> subprocess.Popen:
    return subprocess.Popen([FTL, "campaign", "run", "--plan", str(plan), "--repo", str(repo),
                             "--jobs", str(jobs), "--executor", "ray", "--ray-address", address,
                             "--config", str(config), "--json"],
                            stdout=subprocess.PIPE, stderr=stderr.open("w"), text=True)


def _placed(repo: Path) -> set[str]:
    return {e["task_seq"] for e in _events(repo) if e["event"] == "TASK_PLACED"}


def _started(repo: Path) -> set[str]:
    return {e["task_seq"] for e in _events(repo) if e["event"] == "TASK_START"}


def test_all_worker_nodes_gone_stops_the_run_resumably_and_a_new_cluster_finishes_it(
        tmp_path: Path, cluster: tuple[Cluster, object]) -> None:
    repo = _repo(tmp_path)
    go = tmp_path / "go"  # absent in the first run: its tasks wait for their node to go
    # Three jobs on a 2-CPU node: two attempts run, the third waits in Ray's queue.
    tasks = [_task(i, f"test -e {go} || sleep 60; echo {i} > f{i}.txt") for i in (1, 2, 3)]
    tasks.append(_task(4, "echo 4 > f4.txt", ["001"]))
    plan = _plan(tmp_path / "plan.json", tasks)
    config = tmp_path / "ftl.toml"  # a 1 s verdict instead of 15 s keeps the test short
    config.write_text("[executor]\nlost_after_s = 1\n")
    stderr = tmp_path / "stderr.txt"
    head, worker = cluster
    proc = _run(repo, plan, head.address, config, stderr, jobs=3)
    try:
        _wait_for(lambda: len(_placed(repo)) == 2 and len(_started(repo)) == 3, 120,
                  "two tasks placed, a third queued")
        head.remove_node(worker, allow_graceful=False)
        removed_at = time.monotonic()
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - removed_at
    err = stderr.read_text()
    # Before, this run never ended: the retries waited in Ray's queue for a node.
    assert took < 45, err[-2000:]
    assert proc.returncode == 75, out[-2000:] + err[-2000:]
    envelope = json.loads(out)
    assert envelope["data"]["ftl_error_type"] == "cluster_lost"
    assert "no live node with CPUs" in envelope["error"], envelope["error"]
    assert "ftl campaign resume" in envelope["data"]["remediation"]
    events = _events(repo)
    end = [e for e in events if e["event"] == "RUN_END"]
    assert [(e["outcome"], e["resumable"], e["exit_code"]) for e in end] == [("stopped", True, 75)]
    # The queued attempt was never placed, and the verdict's cancel reached it too.
    queued = ({"001", "002", "003"} - _placed(repo)).pop()
    ended = {e["task_seq"]: e["status"] for e in events if e["event"] == "TASK_END"}
    assert ended == {"001": "cancelled", "002": "cancelled", "003": "cancelled"}, ended
    # Each attempt whose node died waited for the verdict instead of failing worker_lost.
    failures = sorted((e["task_seq"], e["error_type"]) for e in events
                      if e["event"] == "TOOL_FAILURE")
    assert failures == [("001", "cancelled"), ("002", "cancelled"), ("003", "cancelled")], failures
    assert not [e for e in events if e["event"] == "TASK_PLACED" and e["task_seq"] == queued]
    assert not [e for e in events if e["event"] == "TASK_BLOCKED"]
    status = subprocess.run([FTL, "campaign", "status", "--repo", str(repo), "--json"],
                            capture_output=True, text=True, timeout=60)
    rows = {t["seq"]: t["status"] for t in json.loads(status.stdout)["data"]["tasks"]}
    assert rows == {"001": "pending", "002": "pending", "003": "pending", "004": "pending"}, rows

    go.write_text("")
    new, _ = _cluster()
    try:
        resumed = subprocess.run([FTL, "campaign", "resume", "--repo", str(repo), "--executor",
                                  "ray", "--ray-address", new.address],
                                 capture_output=True, text=True, timeout=120)
    finally:
        new.shutdown()
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    _integrated_once(repo, ["001", "002", "003", "004"])
    _replay_holds(repo)


def test_a_node_that_joins_within_lost_after_s_keeps_the_run_going(
        tmp_path: Path, cluster: tuple[Cluster, object]) -> None:
    repo = _repo(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    release = tmp_path / "release"
    lost_after_s = 10.0  # room for a node to start on a busy machine
    # First try: mark, then wait for the node to go. The retry, on the node that joins, runs
    # until `release`: past the moment a no-capacity clock that a joining node did not reset
    # would stop the run (see below).
    tasks = [_task(i, f"if [ -e {marks}/{i} ]; then while [ ! -e {release} ]; do sleep 0.1; "
                      f"done; echo {i} > f{i}.txt; exit 0; fi; touch {marks}/{i}; sleep 60")
             for i in (1, 2)]
    plan = _plan(tmp_path / "plan.json", tasks)
    config = tmp_path / "ftl.toml"
    config.write_text(f"[executor]\nlost_after_s = {lost_after_s:g}\n")
    log = repo / ".ftl" / "ftl.log"
    head, worker = cluster
    proc = _run(repo, plan, head.address, config, tmp_path / "stderr.txt")
    try:
        # Both commands started (their marks), not only placed: a node removed before a
        # command's mark would make its retry a first try.
        _wait_for(lambda: (marks / "1").exists() and (marks / "2").exists(), 120,
                  "both commands started")
        head.remove_node(worker, allow_graceful=False)
        _wait_for(lambda: log.exists() and "no live node with CPUs" in log.read_text(), 60,
                  "the driver to see no node with CPUs")
        seen = time.monotonic()  # the no-capacity clock started before this
        head.add_node(num_cpus=2)  # the autoscaler's replacement
        # The driver sees the new node (at J) within lost_after_s of the clock's start, or the
        # run is lost anyway; its next node read comes NODES_EVERY_S after J, checked every
        # WATCH_S after a probe of at most 1 s. A clock still running then stops the run; so
        # by this moment (plus 1 s of margin) that read has come and gone.
        time.sleep(max(0.0, seen + lost_after_s + NODES_EVERY_S + WATCH_S + 2.0
                       - time.monotonic()))
        release.touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 0, out[-2000:] + err[-2000:] + log.read_text()[-2000:]
    assert " lost: " not in log.read_text()
    events = _events(repo)
    failures = [(e["task_seq"], e["error_type"]) for e in events if e["event"] == "TOOL_FAILURE"]
    assert sorted(failures) == [("001", "worker_lost"), ("002", "worker_lost")], failures
    ended = {e["task_seq"]: e["status"] for e in events if e["event"] == "TASK_END"}
    assert ended == {"001": "complete", "002": "complete"}, ended
    _integrated_once(repo, ["001", "002"])
    _replay_holds(repo)


def test_a_cluster_with_no_node_with_cpus_at_the_start_stops_the_run_resumably(
        tmp_path: Path, head: Cluster) -> None:
    # Before, each task was refused as a configuration_error (blocked) for reserving more CPUs
    # than the largest node (the head's 0): the workers missing is the cluster's state, not
    # the plan's mistake.
    repo = _repo(tmp_path)
    plan = _plan(tmp_path / "plan.json", [_task(1, "echo 1 > f1.txt")])
    config = tmp_path / "ftl.toml"
    config.write_text("[executor]\nlost_after_s = 1\n")
    assert not head.worker_nodes  # the module's head alone (`cluster` removes its nodes)
    out = _stopped_resumably(repo, plan, head.address, config, tmp_path / "stderr.txt")
    envelope = json.loads(out)
    assert envelope["data"]["ftl_error_type"] == "cluster_lost"
    assert "no live node with CPUs" in envelope["error"], envelope["error"]
    events = _events(repo)
    assert [(e["task_seq"], e["status"]) for e in events if e["event"] == "TASK_END"] == [
        ("001", "cancelled")]
    assert [e["resumable"] for e in events if e["event"] == "RUN_END"] == [True]


def _stopped_resumably(repo: Path, plan: Path, address: str, config: Path, stderr: Path) -> str:
    """Run the campaign on the cluster at ``address`` to its end, check it stopped with exit
    75, and return its stdout (the envelope)."""
    proc = _run(repo, plan, address, config, stderr)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, out[-2000:] + stderr.read_text()[-2000:]
    return out


def test_a_command_killed_with_its_node_is_the_node_s_loss_not_the_task_s(
        tmp_path: Path, cluster: tuple[Cluster, object]) -> None:
    # A dying node's worker can outlive its command for a moment and send back "build failed
    # (exit -9)". Here the command kills its node's raylet (the worker's parent), then itself:
    # before, that result blocked the task as task_failed; now the node is found gone (its
    # raylet refuses connections) and the task waits for the verdict like any other.
    repo = _repo(tmp_path)
    run = "kill -9 $(ps -o ppid= -p $PPID); kill -9 $$"
    plan = _plan(tmp_path / "plan.json", [_task(1, run)])
    config = tmp_path / "ftl.toml"
    config.write_text("[executor]\nlost_after_s = 1\n")
    head, _ = cluster
    _stopped_resumably(repo, plan, head.address, config, tmp_path / "stderr.txt")
    events = _events(repo)
    failures = [(e["task_seq"], e["error_type"]) for e in events if e["event"] == "TOOL_FAILURE"]
    assert failures == [("001", "cancelled")], failures
    assert [e["status"] for e in events if e["event"] == "TASK_END"] == ["cancelled"]
