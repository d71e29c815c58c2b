"""Crash-safety harness: SIGKILL ``ftl campaign run`` at seeded random moments, resume, and check
that the crash changed nothing but the log's story.

Two plans: the failure drill (a flaky verify retried, a structural failure blocking two
dependents, parallel branches) and a plan of 32 short tasks over four layers with one
structural failure and its cascade. Every task's run command appends one line to a marker file
outside the repository when it completes, so a run command that completes twice is counted.

A trial copies a prepared repository, starts the campaign, and kills it (SIGKILL, no cleanup)
once its log has reached a random number of lines plus a random delay of up to 15 ms; one
trial in three also kills the first resume the same way. Then ``ftl campaign resume`` runs to
the end. Checks, per trial:

- every task ends in the state the clean run gives (expected.json for the drill, a clean run
  for the wide plan), with the same exit code and the same blocked roots;
- no task's run command completed twice (a complete task's marker has exactly one line);
- the log replays with no invariant violation across the crash boundaries, and shows them;
- the store passes ``PRAGMA integrity_check`` and its foreign-key check.

Bounded for CI: ``FTL_CRASH_TRIALS`` (default 20, split between the two plans) trials, two at a
time. More: ``FTL_CRASH_TRIALS=200 .venv/bin/python -m pytest tests/test_crash_harness.py``;
``FTL_CRASH_SEED`` changes the moments (the seed is in every failure message).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ftl.replay import replay
from ftl.store import Store

ROOT = Path(__file__).resolve().parents[1]
DRILL = ROOT / "examples" / "failure-drill"
FTL = [sys.executable, "-m", "ftl"]
TRIALS = int(os.environ.get("FTL_CRASH_TRIALS", "20"))
SEED = int(os.environ.get("FTL_CRASH_SEED", "20261121"))
PARALLEL = 2
RUN_TIMEOUT_S = 120.0

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SIGKILL harness needs Linux")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHON": sys.executable, "PYTHONDONTWRITEBYTECODE": "1"}


def _git_init(repo: Path) -> None:
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "baseline"]):
        subprocess.run(["git", "-c", "user.name=ftl harness", "-c", "user.email=h@example.invalid",
                        "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args],
                       cwd=repo, check=True, capture_output=True)


def _count_completion(run: str, marker: Path) -> str:
    """The run command, then one marker line (with a ns timestamp, for evidence) on exit 0."""
    return (f"(\n{run}\n)\nharness_status=$?\nif [ $harness_status -eq 0 ]; then "
            f"echo \"done $(date +%s%N)\" >> '{marker}'; fi\nexit $harness_status")


@dataclass
class Scenario:
    name: str
    template: Path
    plan: dict
    jobs: int
    expected: dict[str, str] = field(default_factory=dict)
    blocked_by: dict[str, list[str]] = field(default_factory=dict)
    exit_code: int = 0
    lines: int = 0  # log lines of a clean run

    def plan_for(self, markers: Path) -> dict:
        plan = json.loads(json.dumps(self.plan))
        for task in plan["tasks"]:
            task["run"] = _count_completion(task["run"], markers / task["seq"])
        return plan


def _wide_plan() -> dict:
    """32 short tasks: 6 roots, 12 tasks on one parent each, 10 joins, 4 leaves; task 010 fails
    structurally (a missing module), so 021, 022, 031 and 032 become unreachable."""
    tasks = []
    for i in range(1, 33):
        seq = f"{i:03d}"
        if i <= 6:
            depends: list[str] | str = "none"
        elif i <= 18:
            depends = [f"{(i - 7) % 6 + 1:03d}"]
        elif i <= 28:
            depends = [f"{i - 12:03d}", f"{i - 11:03d}"]
        else:
            depends = [f"{i - 10:03d}"]
        run = f"mkdir -p out && echo {seq} > out/{seq}.txt"
        if seq == "010":
            run = '"${PYTHON:-python3}" -c "import ftl_harness_missing_module"'
        tasks.append({"seq": seq, "slug": f"step-{seq}", "delta": [], "creates": [f"out/{seq}.txt"],
                      "run": run, "verify": f"test -s out/{seq}.txt", "depends": depends,
                      "timeout_s": 60})
    return {"objective": "crash harness: 32 short tasks", "tasks": tasks}


def _ftl_toml(repo: Path) -> None:
    # Same decisions as the defaults, shorter waits: the flaky verify's backoff in ms, not 0.5 s.
    (repo / "ftl.toml").write_text("retry_backoff_min_s = 0.05\nretry_backoff_max_s = 0.2\n")


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Scenario]:
    base = tmp_path_factory.mktemp("crash-templates")
    drill = base / "drill"
    shutil.copytree(DRILL / "project", drill, ignore=shutil.ignore_patterns("__pycache__", ".drill", "build"))
    _ftl_toml(drill)
    _git_init(drill)
    expected = json.loads((DRILL / "expected.json").read_text())
    wide = base / "wide"
    wide.mkdir()
    (wide / ".gitignore").write_text(".ftl/\n")
    _ftl_toml(wide)
    _git_init(wide)
    found = {
        "drill": Scenario("drill", drill, json.loads((DRILL / "plan.json").read_text()), jobs=2,
                          expected=expected["tasks"], blocked_by=expected["blocked_by"],
                          exit_code=expected["exit_code"]),
        "wide": Scenario("wide", wide, _wide_plan(), jobs=3),
    }
    for scenario in found.values():  # one clean run each: its length, and (wide) its outcome
        trial = _Trial(scenario, base / f"clean-{scenario.name}", random.Random(0))
        code = trial.run(["campaign", "run", "--plan", str(trial.plan_file)], kill_at=None)
        tasks = trial.tasks()
        if scenario.name == "wide":
            scenario.expected = {seq: t["status"] for seq, t in tasks.items()}
            scenario.blocked_by = {seq: t["blocked_by"] for seq, t in tasks.items() if t["blocked_by"]}
            scenario.exit_code = code
            assert scenario.expected["010"] == "blocked" and code == 3, tasks
            assert sorted(scenario.blocked_by) == ["021", "022", "031", "032"]
        assert code == scenario.exit_code, trial.evidence("clean run")
        assert {seq: t["status"] for seq, t in tasks.items()} == scenario.expected, trial.evidence("clean run")
        assert trial.replayed().violations == []
        scenario.lines = trial.log_lines()
    return found


class _Trial:
    """One repository, one campaign, killed and resumed."""

    def __init__(self, scenario: Scenario, where: Path, rng: random.Random) -> None:
        self.scenario, self.rng = scenario, rng
        self.repo = where / "repo"
        self.markers = where / "markers"
        shutil.copytree(scenario.template, self.repo, symlinks=True)
        self.markers.mkdir(parents=True)
        self.plan_file = where / "plan.json"
        self.plan_file.write_text(json.dumps(scenario.plan_for(self.markers)))
        self.kills: list[dict] = []

    def log(self) -> Path | None:
        logs = sorted((self.repo / ".ftl" / "events").glob("*.jsonl"))
        return logs[0] if logs else None

    def log_lines(self) -> int:
        log = self.log()
        if log is None:
            return 0
        with open(log, "rb") as handle:
            return handle.read().count(b"\n")

    def run(self, args: list[str], kill_at: tuple[int, float] | None) -> int | None:
        """Run ftl; with ``kill_at=(lines, delay_s)`` SIGKILL it once its log has that many
        lines, after the delay. Returns the exit code, or None when it was killed."""
        proc = subprocess.Popen([*FTL, *args, "--repo", str(self.repo), "--jobs", str(self.scenario.jobs),
                                 "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=_env(), cwd=self.repo)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        try:
            if kill_at is not None:
                lines, delay_s = kill_at
                while proc.poll() is None and time.monotonic() < deadline:
                    if self.log_lines() >= lines:
                        time.sleep(delay_s)
                        if proc.poll() is None:
                            proc.send_signal(signal.SIGKILL)
                            proc.wait(timeout=30)
                            self.kills.append({"after_lines": lines, "delay_ms": round(delay_s * 1000, 1),
                                               "at_ns": time.time_ns(), "log_lines": self.log_lines(),
                                               "after_run_end": self.last_event() == "RUN_END"})
                            return None
                        break
                    time.sleep(0.003)
            return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def last_event(self) -> str | None:
        log = self.log()
        lines = log.read_bytes().splitlines() if log else []
        try:
            return json.loads(lines[-1]).get("event") if lines else None
        except ValueError:
            return None  # a torn last line: the kill fell inside a write

    def store(self) -> Store:
        return Store.for_repo(self.repo)

    def campaign(self) -> dict | None:
        store = self.store()
        try:
            return store.latest_campaign()
        finally:
            store.close()

    def tasks(self) -> dict[str, dict]:
        store = self.store()
        try:
            campaign = store.latest_campaign()
            return {t["seq"]: t for t in store.tasks(campaign["id"])} if campaign else {}
        finally:
            store.close()

    def replayed(self):
        log = self.log()
        return replay([log]) if log else None

    def completions(self) -> dict[str, list[int]]:
        """Per task, the ns timestamps of its run command's completions."""
        out: dict[str, list[int]] = {}
        for marker in sorted(self.markers.iterdir()):
            out[marker.name] = [int(line.split()[1]) for line in marker.read_text().splitlines() if line]
        return out

    def evidence(self, what: str) -> str:
        lines = [f"[{self.scenario.name}] {what}", f"kills: {self.kills}"]
        kill_ns = self.kills[0]["at_ns"] if self.kills else None
        for seq, stamps in self.completions().items():
            if len(stamps) != 1:
                rel = [f"{(s - kill_ns) / 1e6:+.1f} ms" for s in stamps] if kill_ns else stamps
                lines.append(f"task {seq} completions (relative to the first kill): {rel}")
        store = self.store()
        try:
            campaign = store.latest_campaign()
            if campaign:
                lines.append(f"campaign {campaign['id']} status={campaign['status']} "
                             f"state={campaign.get('machine_state')}")
                for row in store.workspaces(campaign["id"]):
                    lines.append(f"  workspace {row['workspace_id']}#{row['attempt']} {row['status']} "
                                 f"{row['created_at']} -> {row['finished_at']}")
        finally:
            store.close()
        log = self.log()
        if log is not None:
            tail = log.read_text(errors="replace").splitlines()[-12:]
            lines.append("log tail:\n  " + "\n  ".join(t[:240] for t in tail))
        return "\n".join(lines)


def _one_trial(scenario: Scenario, where: Path, seed: int) -> list[str]:
    """Run one trial; return its problems (empty when every check holds)."""
    rng = random.Random(seed)
    trial = _Trial(scenario, where, rng)
    problems: list[str] = []
    target = rng.randint(1, max(1, scenario.lines - 1))
    code = trial.run(["campaign", "run", "--plan", str(trial.plan_file)], kill_at=(target, rng.uniform(0, 0.015)))
    double = rng.random() < 1 / 3
    for _ in range(4):
        if code is not None:
            break
        campaign = trial.campaign()
        if campaign is None:
            return []  # killed before the campaign existed: nothing happened
        if campaign["status"] != "active":
            break  # killed after the campaign finished: nothing to resume
        kill_at = None
        if double:
            double = False
            now = trial.log_lines()
            kill_at = (now + rng.randint(1, max(1, scenario.lines - target)), rng.uniform(0, 0.015))
        code = trial.run(["campaign", "resume"], kill_at=kill_at)
    label = f"seed {seed}"
    result = trial.replayed()
    story_code = result.exit_code if result is not None else None
    if story_code != scenario.exit_code or code not in (None, scenario.exit_code):
        problems.append(f"{label}: exit code {code} (log: {story_code}), a clean run gives "
                        f"{scenario.exit_code}")
    tasks = trial.tasks()
    statuses = {seq: t["status"] for seq, t in tasks.items()}
    if statuses != scenario.expected:
        wrong = {s: (statuses.get(s), scenario.expected.get(s)) for s in set(statuses) | set(scenario.expected)
                 if statuses.get(s) != scenario.expected.get(s)}
        problems.append(f"{label}: task states differ from a clean run (got, clean): {wrong}")
    blocked_by = {seq: t["blocked_by"] for seq, t in tasks.items() if t["blocked_by"]}
    if blocked_by != scenario.blocked_by:
        problems.append(f"{label}: blocked roots {blocked_by}, clean run {scenario.blocked_by}")
    for seq, stamps in trial.completions().items():
        limit_ok = len(stamps) == 1 if statuses.get(seq) == "complete" else len(stamps) <= 1
        if not limit_ok:
            problems.append(f"{label}: task {seq}'s run command completed {len(stamps)} times")
    if result is None:
        problems.append(f"{label}: no event log")
    else:
        if result.violations:
            problems.append(f"{label}: replay violations {[v.to_json() for v in result.violations]}")
        # A kill after RUN_END (before the store finished the campaign) is not a crash in the
        # story: the resume finishes the campaign again.
        crashes = sum(1 for kill in trial.kills if not kill["after_run_end"])
        crashed_runs = sum(1 for run in result.runs if run.crashed)
        if crashed_runs != crashes:
            problems.append(f"{label}: {crashes} kill(s) before RUN_END but the log shows "
                            f"{crashed_runs} crash(es)")
    store = trial.store()
    try:
        integrity = store.integrity_check()
    finally:
        store.close()
    if integrity != "ok":
        problems.append(f"{label}: store integrity: {integrity}")
    if problems:
        problems.append(trial.evidence(label))
    return problems


def _trial_seeds(name: str) -> list[int]:
    count = TRIALS // 2 + (TRIALS % 2 if name == "drill" else 0)
    rng = random.Random(f"{SEED}-{name}")
    return [rng.randrange(1 << 30) for _ in range(count)]


@pytest.mark.parametrize("name", ["drill", "wide"])
def test_sigkill_at_random_moments_then_resume_changes_nothing(
        name: str, scenarios: dict[str, Scenario], tmp_path: Path) -> None:
    scenario = scenarios[name]
    seeds = _trial_seeds(name)
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        results = list(pool.map(lambda item: _one_trial(scenario, tmp_path / f"t{item[0]}", item[1]),
                                enumerate(seeds)))
    problems = [p for trial in results for p in trial]
    assert not problems, f"{len(problems)} problem(s) in {len(seeds)} trials (FTL_CRASH_SEED={SEED}):\n" \
        + "\n".join(problems)


def test_trials_are_split_between_both_plans() -> None:
    assert len(_trial_seeds("drill")) + len(_trial_seeds("wide")) == TRIALS
    assert _trial_seeds("wide") == _trial_seeds("wide")  # seeded: the same moments every run
