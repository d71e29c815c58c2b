"""Every default ftl uses, named in one place, overridable by ``ftl.toml`` (or ``--config FILE``).

Defaults come from FTL's SKILL constants (MAX_ITERATIONS 20, STUCK_THRESHOLD 3,
MAX_CLARIFICATIONS 5, EXPLORER_TIMEOUT 300 s, quorum 3 of 4, re-plan at >= 2 unreachable tasks)
and from design.md §4.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ftl.errors import FtlError
from ftl.explore_rules import DEFAULT_EXPLORER_QUORUM, DEFAULT_EXPLORER_TIMEOUT_S


class ClaudeSettings(BaseModel):
    """The ``[claude]`` table: how ftl runs Claude Code as a builder or planner (issue 12).

    ftl runs ``<command> -p --output-format stream-json --verbose --max-turns N`` itself, with
    ``--agent <agent>``, ``--model``, ``--permission-mode`` when set, then ``extra_args``.
    """

    model_config = ConfigDict(extra="forbid")

    command: list[str] = Field(default_factory=lambda: ["claude"], min_length=1,
                               description="The CLI (argv prefix), e.g. [\"npx\", \"claude\"].")
    agent: str | None = Field("ftl:builder", description="Builder agent (--agent); None: none.")
    planner_agent: str | None = Field("ftl:planner", description="Planner agent (--agent).")
    model: str | None = Field(None, description="--model; None: the CLI's default.")
    permission_mode: str | None = Field(None, description="--permission-mode, e.g. acceptEdits.")
    extra_args: list[str] = Field(default_factory=list, description="Appended to every run.")
    turns_per_budget: int = Field(10, ge=1, le=1000, description=(
        "--max-turns = task budget x this (FTL's budget counts tool calls; a turn is one "
        "model response with its tool calls)."))
    planner_max_turns: int = Field(30, ge=1, le=1000, description="--max-turns of a planner run.")
    idle_timeout_s: float = Field(600.0, gt=0, description=(
        "No stream event for this long (s): the agent is stalled, stopped and resumed once."))


class ExecutorSettings(BaseModel):
    """The ``[executor]`` table: where task attempts run (issue 14).

    ``kind = "local"`` (default): on this machine. ``kind = "ray"``: each attempt's build and
    verify run as one Ray task on a cluster at ``address`` (``"auto"``: the cluster started on
    this machine with ``ray start``; ``"HOST:PORT"`` of a head node; ``"ray://HOST:PORT"``);
    needs ``pip install 'ftl-runner[ray]'`` and git on every node.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "ray"] = Field("local", description="local | ray.")
    address: str = Field("auto", min_length=1, description="Ray cluster address (kind = ray).")
    lost_after_s: float = Field(15.0, gt=0, le=50, description=(
        "kind = ray: how long the head may refuse connections, or have no live node with "
        "CPUs while attempts wait for one, before the cluster counts as lost and the run "
        "stops, resumable (s; under Ray's own 60 s, after which its driver ends the process)."))


class Config(BaseModel):
    """Runner configuration. Units are in the names (``_s`` seconds, ``_ms`` milliseconds)."""

    model_config = ConfigDict(extra="forbid")

    max_iterations: int = Field(20, ge=1, description="EXECUTE entries before iteration_exhausted.")
    stuck_threshold: int = Field(3, ge=1, description="Unchanged ready sets before stuck_detected.")
    max_clarifications: int = Field(5, ge=0, description="Planner clarification rounds.")
    max_replans: int = Field(2, ge=0, description="Adaptive re-plans per campaign.")
    replan_threshold: int = Field(2, ge=1, description="Unreachable tasks that trigger a re-plan.")
    max_replan_new_tasks: int = Field(20, ge=0, description="New tasks one re-plan may add.")
    explorer_timeout_s: float = Field(DEFAULT_EXPLORER_TIMEOUT_S, gt=0)
    explorer_quorum: int = Field(DEFAULT_EXPLORER_QUORUM, ge=1, le=4)
    jobs: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    seconds_per_budget: float = Field(60.0, gt=0, description="Task timeout = budget x this, s.")
    verify_timeout_s: float = Field(300.0, gt=0)
    transient_retries: int = Field(1, ge=0, le=1, description="Retries of a transient failure.")
    flaky_verify_retries: int = Field(2, ge=0, le=2, description="Retries of a failing verify.")
    retry_backoff_min_s: float = Field(0.5, ge=0)
    retry_backoff_max_s: float = Field(30.0, ge=0, description=(
        "Longest exponential backoff between two tries, s."))
    retry_after_max_s: float = Field(300.0, ge=0, description=(
        "Longest wait for a server's retry-after (a rate limit's window), s; a server asking "
        "for longer is waited this long, then tried once more."))
    agent_command: list[str] | None = Field(
        None, description="Agent builder command; gets the workspace JSON on stdin.")
    planner_command: list[str] | None = Field(
        None, description="Planner agent command; gets the planning input JSON on stdin.")
    builder: Literal["agent", "claude"] = Field("agent", description=(
        "Builder for tasks without a run command: 'agent' runs agent_command (JSON on stdin), "
        "'claude' runs Claude Code itself and reads its event stream ([claude] table)."))
    planner: Literal["agent", "claude"] = Field("agent", description=(
        "Planner when no plan is given: 'agent' runs planner_command, 'claude' runs Claude Code."))
    claude: ClaudeSettings = Field(default_factory=ClaudeSettings)
    max_cost_usd: float | None = Field(None, gt=0, description=(
        "Campaign agent spend limit, USD: once reached no agent task starts; the rest end "
        "budget_exhausted."))
    server: str | None = Field(None, description=(
        "MangleCP server: None or 'embedded' (ftl's, in the runner's process), 'embedded:stdio' "
        "(ftl's, as a subprocess over stdio), 'stdio:CMD' or an http(s) URL."))
    output_limit_bytes: int = Field(64 * 1024, ge=1024, description="Command output kept per step.")
    isolation: Literal["auto", "worktree", "shared"] = Field("auto", description=(
        "Where tasks run: 'worktree' (a git worktree per task, results integrated as commits), "
        "'shared' (every task in the repository's own checkout) or 'auto' (worktree in a git "
        "work tree with a commit, else shared)."))
    executor: ExecutorSettings = Field(default_factory=ExecutorSettings)
    gates: dict[str, Any] = Field(default_factory=dict, description=(
        "The [gates] table: visibility, governance, policy and approval (parsed and checked by "
        "ftl.gate)."))

    def task_timeout_s(self, budget: int, timeout_s: float | None) -> float:
        """A task's wall-clock limit in s: its own ``timeout_s``, else ``budget * seconds_per_budget``."""
        return timeout_s if timeout_s is not None else budget * self.seconds_per_budget


def load_config(path: Path | None, repo: Path, **overrides: Any) -> Config:
    """Read ``path`` (or ``<repo>/ftl.toml`` when present) and apply CLI ``overrides``
    (``executor_kind`` and ``ray_address`` go into the ``[executor]`` table).

    Raises:
        FtlError(configuration_error): unreadable TOML or a field outside its range; the
            details name every offending field.
    """
    data: dict[str, Any] = {}
    source = path or (repo / "ftl.toml")
    if path is not None or source.exists():
        import tomllib  # only where a file is read: the embedded server gets its config as JSON

        try:
            data = tomllib.loads(source.read_text(encoding="utf-8"))
        except OSError as exc:  # the name only: a response never carries an absolute path
            raise FtlError("configuration_error",
                           {"problem": f"{source.name}: {exc.strerror or 'cannot be read'}"}) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise FtlError("configuration_error", {"problem": f"{source.name}: {exc}"}) from None
        data = data.get("ftl", data)
    executor = {"executor_kind": "kind", "ray_address": "address"}
    for flag, key in executor.items():  # --executor / --ray-address fill the [executor] table
        value = overrides.pop(flag, None)
        if value is not None:
            table = data.get("executor")
            data["executor"] = {**(table if isinstance(table, dict) else {}), key: value}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        violations = [{"path": ".".join(map(str, e["loc"])), "message": e["msg"]} for e in exc.errors()]
        raise FtlError("configuration_error",
                       {"problem": f"{len(violations)} invalid field(s)", "violations": violations}) from None
