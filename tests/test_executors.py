"""The executor interface (`ftl.executors.base`) and what needs no cluster: the local backend's
contract, the [executor] settings, and a clear refusal when a Ray cluster cannot be used."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ftl.config import load_config
from ftl.errors import FtlError
from ftl.executors.base import Executor, Finished
from ftl.executors.local import LocalExecutor
from ftl.engine.scheduler import Scheduler, TaskOutcome

FTL = str(Path(sys.executable).parent / "ftl")


def test_the_local_executor_returns_every_submitted_call_once_and_close_waits() -> None:
    gate = threading.Event()
    ran: list[str] = []

    def execute(seq: str, worker: str) -> TaskOutcome:
        gate.wait(5)
        ran.append(seq)
        return TaskOutcome(seq, "complete", {"worker": worker})

    executor = LocalExecutor()
    assert isinstance(executor, Executor)
    executor.start(2, execute)
    for seq in ("1", "2", "3"):
        executor.submit(seq, f"w{seq}")
    assert executor.next_finished(0.05) is None  # none can finish before the gate opens
    assert executor.heartbeat().running == 3
    gate.set()
    executor.close()  # returns only when all three ran
    finished = [executor.next_finished(0) for _ in range(3)]
    assert executor.next_finished(0) is None
    assert sorted(f.seq for f in finished) == ["1", "2", "3"]
    assert all(isinstance(f, Finished) and f.outcome.detail["worker"] == f.worker for f in finished)
    health = executor.heartbeat()
    assert (health.kind, health.alive, health.running, health.nodes[0]["node"]) == \
        ("local", True, 0, "driver")


class _Recording(LocalExecutor):
    """A local executor that remembers what the scheduler asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def start(self, slots, execute) -> None:
        self.calls.append(f"start {slots}")
        super().start(slots, execute)

    def submit(self, seq: str, worker: str) -> None:
        self.calls.append(f"submit {seq}")
        super().submit(seq, worker)

    def close(self) -> None:
        self.calls.append("close")
        super().close()


def test_the_scheduler_talks_only_to_its_executor() -> None:
    executor = _Recording()
    deps = {"1": [], "2": ["1"], "3": ["1"]}
    outcomes = Scheduler(deps, jobs=4, executor=executor,
                         run_task=lambda seq, token, worker: TaskOutcome(seq, "complete")).run()
    assert set(outcomes) == {"1", "2", "3"}
    # Slots: never more than the runnable tasks; task 1 before its dependents; closed at the end.
    assert executor.calls[0] == "start 3" and executor.calls[1] == "submit 1"
    assert sorted(executor.calls[2:4]) == ["submit 2", "submit 3"]
    assert executor.calls[-1] == "close"


def test_executor_settings_come_from_ftl_toml_and_the_flags(tmp_path: Path) -> None:
    assert load_config(None, tmp_path).executor.kind == "local"
    (tmp_path / "ftl.toml").write_text('[executor]\nkind = "ray"\naddress = "10.0.0.5:6379"\n')
    config = load_config(None, tmp_path)
    assert (config.executor.kind, config.executor.address) == ("ray", "10.0.0.5:6379")
    flagged = load_config(None, tmp_path, executor_kind="local", ray_address="auto")
    assert (flagged.executor.kind, flagged.executor.address) == ("local", "auto")
    (tmp_path / "ftl.toml").write_text('[executor]\nkind = "slurm"\n')
    with pytest.raises(FtlError) as caught:
        load_config(None, tmp_path)
    assert caught.value.error_type == "configuration_error"
    assert caught.value.details["violations"][0]["path"] == "executor.kind"


def test_a_missing_ray_install_is_a_configuration_error_naming_the_extra(monkeypatch) -> None:
    from ftl.executors import ray_cluster

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(FtlError) as caught:
        ray_cluster.RayCluster("auto", Path("."))
    assert caught.value.error_type == "configuration_error"
    assert "ftl-runner[ray]" in caught.value.message


def test_a_campaign_refused_for_an_unreachable_cluster_says_how_to_fix_it(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "commit", "-qm",
                    "init"], cwd=repo, check=True)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"objective": "o", "tasks": [
        {"seq": "1", "slug": "a", "type": "BUILD", "delta": ["a.txt"], "run": "true",
         "verify": "true"}]}))
    done = subprocess.run([FTL, "campaign", "run", "--plan", str(plan), "--repo", str(repo),
                           "--executor", "ray", "--ray-address", "127.0.0.1:1", "--json"],
                          capture_output=True, text=True, timeout=120)
    envelope = json.loads(done.stdout)
    assert done.returncode != 0 and envelope["success"] is False
    assert envelope["data"]["ftl_error_type"] == "configuration_error"
    assert "ray start --head" in envelope["error"]
    assert str(tmp_path) not in done.stdout  # no absolute path in a response
