"""Pydantic models for the data ftl exchanges: plans, tasks, workspaces, tool results.

Shapes follow FTL's plan.json (FTL planner contract, `shared/reference/ftl-behaviour.md` §5.1),
tightened where FTL only asked: seqs are numbers (``"1"``, ``"001"`` and ``1`` are one task),
``depends`` is always a list after parsing, slugs are kebab-case, delta paths carry no globs.
The value rules themselves live in `ftl.plan_rules` (pure, no pydantic), shared with the lean
registration path `ftl.plan_rows`; this module imports nothing else of ftl's.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, ValidationInfo,
                      field_validator, model_validator)

from ftl import plan_rules
# Re-exported: callers import the seq rules and patterns from here, as before.
from ftl.plan_rules import GLOB_CHARS, SLUG_RE, normalize_depends, normalize_seq  # noqa: F401
from ftl.explore_rules import CRITICAL_EXPLORER_MODES, EXPLORER_MODES, ExplorerMode, quorum_met  # noqa: F401


class TaskType(str, enum.Enum):
    SPEC = "SPEC"
    BUILD = "BUILD"
    VERIFY = "VERIFY"


class TaskStatus(str, enum.Enum):
    """A task's lifecycle in the store: pending -> running -> complete | blocked.

    blocked -> pending happens only through a re-plan merge; running -> pending only on resume
    after a crash (the in-flight attempt is discarded and re-run from a fresh workspace).
    """

    PENDING = "pending"
    RUNNING = "running"
    COMPLETE = "complete"
    BLOCKED = "blocked"


#: Languages an idiom's ast-grep pattern may name, with the file suffixes each one checks
#: (ast-grep's built-in grammars; `ftl.idioms` parses only files with these suffixes).
IDIOM_LANGUAGES: dict[str, tuple[str, ...]] = {
    "python": (".py", ".pyi"),
    "javascript": (".js", ".mjs", ".cjs", ".jsx"),
    "typescript": (".ts", ".mts", ".cts"),
    "tsx": (".tsx",),
    "go": (".go",),
    "rust": (".rs",),
    "java": (".java",),
    "ruby": (".rb",),
    "c": (".c", ".h"),
    "cpp": (".cc", ".cpp", ".cxx", ".hpp", ".hh"),
}
IdiomLanguage = Literal["python", "javascript", "typescript", "tsx", "go", "rust", "java", "ruby",
                        "c", "cpp"]


class IdiomRule(BaseModel):
    """An idiom that ftl checks by code (issue 15), besides its text for agents.

    Exactly one of ``pattern`` (an ast-grep pattern such as ``print($$$)``, matched in files of
    ``language``) or ``regex`` (a Python regular expression, matched line by line in every
    changed text file). A plain string idiom stays guidance only, as in FTL.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    text: str = Field(min_length=1, description="The idiom as agents read it.")
    pattern: str | None = Field(default=None, min_length=1,
                                description="ast-grep pattern, e.g. 'print($$$)'.")
    language: IdiomLanguage | None = Field(
        default=None, description="Language of `pattern` (default python).")
    regex: str | None = Field(default=None, min_length=1,
                              description="Python regular expression, matched per line.")

    @model_validator(mode="after")
    def _one_matcher(self) -> "IdiomRule":
        if (self.pattern is None) == (self.regex is None):
            raise ValueError("an idiom object needs exactly one of 'pattern' or 'regex'")
        if self.regex is not None:
            if self.language is not None:
                raise ValueError("'language' goes with 'pattern', not with 'regex'")
            try:
                re.compile(self.regex)
            except re.error as error:
                raise ValueError(f"regex {self.regex!r} does not compile: {error}") from None
        if self.pattern is not None:
            _check_ast_grep_pattern(self.pattern, self.language or "python")
        return self

    @property
    def lang(self) -> str:
        """The pattern's language (``python`` when the entry names none)."""
        return self.language or "python"


def _check_ast_grep_pattern(pattern: str, language: str) -> None:
    """Raise ValueError when ast-grep cannot build a matcher from ``pattern`` (e.g. ``''``)."""
    from ast_grep_py import SgRoot  # imported here: plans without idiom objects never load it

    try:
        SgRoot("", language).root().find_all(pattern=pattern)
    except RuntimeError:
        raise ValueError(f"pattern {pattern!r} is not a valid ast-grep pattern for {language}; "
                         "write it as the code it should match, e.g. 'print($$$)'") from None


def _idiom_tag(value: Any) -> str:
    return "text" if isinstance(value, str) else "rule"


# Tagged so that a bad object reports its own errors, not also "should be a string".
IdiomEntry = Annotated[Union[Annotated[str, Tag("text")], Annotated[IdiomRule, Tag("rule")]],
                       Discriminator(_idiom_tag)]


class Idioms(BaseModel):
    """A plan's idioms (FTL plan.json ``idioms``): each entry a plain string (guidance) or an
    `IdiomRule` that ftl checks after a task's build (`ftl.idioms.check_idioms`)."""

    model_config = ConfigDict(extra="forbid")
    required: list[IdiomEntry] = Field(default_factory=list)
    forbidden: list[IdiomEntry] = Field(default_factory=list)


class TaskResources(BaseModel):
    """A task's reservation on a Ray node (issue 14): Ray schedules the attempt where it fits."""

    model_config = ConfigDict(extra="forbid")

    num_cpus: float = Field(1.0, ge=0, le=1024, description="CPUs reserved while the attempt runs.")


class Task(BaseModel):
    """One node of the plan DAG (FTL plan.json task, plus ftl's ``run`` and ``timeout_s``).

    Fields ftl does not know are kept and passed through (FTL plans carry planner fields such as
    ``preflight`` notes or ``rationale`` that its prompts read back); see docs/ftl-compat.md.
    """

    model_config = ConfigDict(extra="allow")

    seq: str = Field(description="Task number; '1', '001' and 1 are the same task.")
    slug: str = Field(description="kebab-case name; workspace id is '{seq}-{slug}'.")
    type: TaskType = TaskType.BUILD
    delta: list[str] = Field(default_factory=list, description="Files the task may touch (no globs).")
    creates: list[str] = Field(default_factory=list, description="Files the task will create.")
    verify: str = Field(description="Shell command that exits 0 when the task is done.")
    budget: int = Field(default=5, ge=1, le=100, description="Tool-call budget; also scales the timeout.")
    depends: list[str] = Field(default_factory=list, description='"none", a seq, or a list of seqs.')
    run: str | None = Field(default=None, description="Shell command for the shell builder.")
    timeout_s: float | None = Field(default=None, gt=0, description="Wall-clock limit for build+verify, s.")
    preflight: list[str] = Field(default_factory=list)
    verify_source: str | None = None
    target_lines: dict[str, str] = Field(default_factory=dict)
    builder: Literal["shell", "agent"] | None = Field(
        default=None, description="Builder to use; default: shell when `run` is set, else agent.")
    isolation: Literal["worktree", "shared"] | None = Field(
        default=None, description="Where the task runs: its own git worktree, or the shared "
                                  "checkout; default: the campaign's isolation (ftl.toml).")
    resources: TaskResources | None = Field(
        default=None, description="What one attempt reserves on a cluster node (executor kind "
                                  "ray); default 1 CPU.")

    @field_validator("seq", mode="before")
    @classmethod
    def _seq(cls, value: Any) -> str:
        return normalize_seq(value)

    @field_validator("depends", mode="before")
    @classmethod
    def _depends(cls, value: Any) -> list[str]:
        return normalize_depends(value)

    @field_validator("slug")
    @classmethod
    def _slug(cls, value: str) -> str:
        return plan_rules.check_slug(value)

    @field_validator("delta", "creates")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        return plan_rules.check_paths(value)

    @field_validator("verify")
    @classmethod
    def _verify(cls, value: str) -> str:
        return plan_rules.check_verify(value)

    @model_validator(mode="after")
    def _self_dependency(self) -> "Task":
        plan_rules.check_no_self_dependency(self.seq, self.depends)
        return self

    @model_validator(mode="after")
    def _shallow_extras(self, info: ValidationInfo) -> "Task":
        if info.context and info.context.get(plan_rules.NEW_INPUT):  # not a plan saved earlier
            plan_rules.check_extra_depth(self.model_extra or {})
        return self

    @property
    def workspace_id(self) -> str:
        return f"{self.seq}-{self.slug}"

    @property
    def builder_kind(self) -> str:
        return self.builder or ("shell" if self.run else "agent")


class Plan(BaseModel):
    """A campaign plan: FTL plan.json (`objective`, `campaign`, `framework`, `idioms`, `tasks`).

    Unknown top-level fields are kept and passed through, as FTL did (docs/ftl-compat.md).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    schema_version: str = Field(default="1.0", alias="_schema_version")
    objective: str = Field(min_length=1)
    campaign: str | None = Field(default=None, description="kebab-case campaign slug.")
    framework: str | None = None
    framework_confidence: float | None = Field(default=None, ge=0, le=1)
    idioms: Idioms = Field(default_factory=Idioms)
    tasks: list[Task] = Field(min_length=1)
    _task_index: tuple[list[Task] | None, dict[str, Task]] = PrivateAttr(default=(None, {}))  # see `task`

    @field_validator("campaign")
    @classmethod
    def _campaign(cls, value: str | None) -> str | None:
        return plan_rules.check_campaign_slug(value)

    @model_validator(mode="after")
    def _shallow_extras(self, info: ValidationInfo) -> "Plan":
        if info.context and info.context.get(plan_rules.NEW_INPUT):  # not a plan saved earlier
            plan_rules.check_extra_depth(self.model_extra or {})
        return self

    def task(self, seq: Any) -> Task:
        """The task whose seq is ``seq`` (any form `normalize_seq` takes).

        From an index built at the first call (and again if ``tasks`` is replaced): BUILD asks
        for every task it starts, and a scan per call made a campaign quadratic in its plan's
        size (issue 11 item 4: no per-task work over the whole DAG).

        Raises:
            KeyError: no task has that seq. ValueError: ``seq`` is not a seq.
        """
        wanted = normalize_seq(seq)
        tasks, index = self._task_index
        if tasks is not self.tasks:
            index = {}
            for task in self.tasks:
                index.setdefault(task.seq, task)  # the first, as a scan found it
            self._task_index = (self.tasks, index)
        try:
            return index[wanted]
        except KeyError:
            raise KeyError(wanted) from None


class ExplorerResult(BaseModel):
    """One explorer's output (FTL explorer contract §5.5): `mode`, `status`, and its findings."""

    model_config = ConfigDict(extra="allow")
    mode: ExplorerMode
    status: Literal["ok", "partial", "error"]
    error: str | None = None


class Workspace(BaseModel):
    """What a builder receives for one task: the spec, lineage and injected failures (FTL §5.3)."""

    model_config = ConfigDict(extra="forbid")
    workspace_id: str
    campaign_id: str
    seq: str
    slug: str
    type: TaskType
    attempt: int = 1
    objective: str
    delta: list[str]
    creates: list[str] = Field(default_factory=list)
    verify: str
    run: str | None = None
    budget: int
    timeout_s: float
    framework: str | None = None
    idioms: Idioms = Field(default_factory=Idioms)
    lineage: dict[str, Any] = Field(default_factory=dict)
    prior_knowledge: dict[str, Any] = Field(default_factory=dict)
    workdir: str | None = Field(
        default=None, description="Where the builder and verify run, relative to the repository "
                                  "(the task's worktree); None: the repository itself.")
    base_commit: str | None = Field(
        default=None, description="The commit the task's worktree starts from (worktree isolation).")


class BuildResult(BaseModel):
    """What an agent builder prints on stdout as JSON (ftl's builder contract)."""

    model_config = ConfigDict(extra="allow")
    status: Literal["complete", "blocked"]
    delivered: str = ""
    reason: str | None = None
    utilized: list[dict[str, Any]] = Field(default_factory=list)
