"""Plan versions: save, read and mark a campaign's plans, and share a registered plan's task
specs with the task rows (migration 3).

A version is the plan's JSON text (``Plan.model_dump_json(by_alias=True)``), read back byte for
byte. The version add-tasks saves is not written whole: its task list is the task rows' specs,
so the row keeps the text with an empty task list plus where the specs go (``tasks_at``) and
their seqs in plan order (``task_seqs``), and `_plan_text` puts them back. A 10,000-task plan
then writes its 2.5 MB of specs once instead of twice (issue 11 item 4: the second copy cost
about 15 ms of add-tasks' commit). That holds while the task rows keep the specs they were
registered with, so everything that changes a spec or the task set (`merge_revised_plan`) first
writes such versions out whole (`_materialise_plans`), in the same transaction.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any, Sequence

from ftl.errors import FtlError
from ftl.store.codec import _loads, _seqs_json

if TYPE_CHECKING:  # the models (pydantic) load only where a plan is parsed or written
    from ftl.models import Plan
    from ftl.plan_rows import PlanRows

_TASKS_KEY = ',"tasks":['  # where a plan text's task list starts (its header fields come first)
_PLAN_TEXT_COLUMNS = "plan, tasks_at, task_seqs"  # what `Store._plan_text` reads


class PlanVersionsMixin:
    """`ftl.store.Store`'s plan versions. Uses the store's ``_session`` and ``_now`` and
    `CampaignsMixin._campaign_row`."""

    def _insert_plan(self, conn: sqlite3.Connection, campaign_id: str, plan: Plan, now: str) -> int:
        return self._insert_plan_json(conn, campaign_id, plan.model_dump_json(by_alias=True), now)

    @staticmethod
    def _next_plan_version(conn: sqlite3.Connection, campaign_id: str) -> int:
        last = conn.execute("SELECT MAX(version) FROM plan WHERE campaign_id = ?", (campaign_id,)).fetchone()[0]
        return (last or 0) + 1

    def _insert_plan_json(self, conn: sqlite3.Connection, campaign_id: str, plan_json: str, now: str) -> int:
        version = self._next_plan_version(conn, campaign_id)
        conn.execute("INSERT INTO plan (campaign_id, version, plan, created_at) VALUES (?, ?, ?, ?)",
                     (campaign_id, version, plan_json, now))
        return version

    #: Whether add-tasks saves its plan version sharing the task rows' specs (module docstring,
    #: "Plan versions"). A store with False writes every version whole, as schema 2 did; the
    #: tests compare the two.
    share_registered_tasks = True

    def _insert_registered_plan(self, conn: sqlite3.Connection, campaign_id: str, rows: PlanRows,
                                now: str) -> int:
        """Save ``rows.plan_json`` as the next version, its task list shared with the task rows
        add-tasks writes in the same transaction when the text's task list is exactly their
        specs, comma-joined, in plan order (checked here on the text itself, so `_plan_text`
        gives back these bytes whatever produced them); whole otherwise."""
        text = rows.plan_json
        start = text.find(_TASKS_KEY) + len(_TASKS_KEY)
        joined = ",".join([t.spec for t in rows.tasks])
        end = start + len(joined)
        if not (self.share_registered_tasks and rows.tasks and start >= len(_TASKS_KEY)
                and text.startswith(joined, start) and text.startswith("]", end)):
            return self._insert_plan_json(conn, campaign_id, text, now)
        version = self._next_plan_version(conn, campaign_id)
        conn.execute("INSERT INTO plan (campaign_id, version, plan, created_at, tasks_at, task_seqs) "
                     "VALUES (?, ?, ?, ?, ?, ?)",
                     (campaign_id, version, text[:start] + text[end:], now, start,
                      _seqs_json([t.seq for t in rows.tasks])))
        return version

    @staticmethod
    def _plan_text(conn: sqlite3.Connection, campaign_id: str, row: Sequence[Any]) -> str:
        """The plan text of a ``(plan, tasks_at, task_seqs)`` row: ``plan`` itself, or with the
        task rows' specs put back in `task_seqs` order (module docstring, "Plan versions").

        Raises: FtlError(conflict) when a shared task row is missing (a store changed by hand).
        """
        text, start, seqs = row[0], row[1], row[2]
        if start is None:
            return text
        specs = dict(conn.execute("SELECT seq, spec FROM task WHERE campaign_id = ?", (campaign_id,)))
        try:
            joined = ",".join([specs[seq] for seq in _loads(seqs)])
        except KeyError as exc:
            raise FtlError("conflict", {"what": f"A plan version of campaign {campaign_id} names task "
                                                f"{exc.args[0]}, which the store no longer has; restore "
                                                "a backup of the store."}) from None
        return text[:start] + joined + text[start:]

    def _materialise_plans(self, conn: sqlite3.Connection, campaign_id: str) -> None:
        """Write every plan version of the campaign that shares its tasks with the task rows out
        whole; called in the transaction of any change to a task's spec or to the task set,
        before the change (copy-on-write), so each version keeps reading back as saved."""
        shared = conn.execute("SELECT version, plan, tasks_at, task_seqs FROM plan WHERE campaign_id = ? "
                              "AND tasks_at IS NOT NULL", (campaign_id,)).fetchall()
        for row in shared:
            conn.execute("UPDATE plan SET plan = ?, tasks_at = NULL, task_seqs = NULL "
                         "WHERE campaign_id = ? AND version = ?",
                         (self._plan_text(conn, campaign_id, row[1:]), campaign_id, row[0]))

    def _is_latest_plan(self, conn: sqlite3.Connection, campaign_id: str, plan_json: str) -> bool:
        """Whether the campaign's latest plan version equals the plan ``plan_json`` (both are
        ``Plan.model_dump_json`` texts). Equal text is the common case; otherwise the decoded
        values are compared, which is `Plan` equality (fields and extras, extras in any order)
        without loading pydantic or building 10,000 models."""
        row = conn.execute(f"SELECT {_PLAN_TEXT_COLUMNS} FROM plan WHERE campaign_id = ? "
                           "ORDER BY version DESC LIMIT 1", (campaign_id,)).fetchone()
        if row is None:
            return False
        saved = self._plan_text(conn, campaign_id, row)
        return saved == plan_json or _loads(saved) == _loads(plan_json)

    def save_plan(self, campaign_id: str, plan: Plan) -> int:
        """Save ``plan`` as the campaign's next plan version; return it (1, 2, ...).

        Raises: FtlError(not_found) for an unknown campaign.
        """
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            return self._insert_plan(conn, campaign_id, plan, self._now())

    def get_plan(self, campaign_id: str, version: int | None = None) -> Plan:
        """Plan ``version`` of the campaign (the latest by default).

        Raises: FtlError(not_found) naming the campaign or the missing version.
        """
        from ftl.models import Plan
        return Plan.model_validate_json(self.plan_text(campaign_id, version))

    def plan_text(self, campaign_id: str, version: int | None = None) -> str:
        """The JSON text of plan ``version`` of the campaign (the latest by default), exactly as
        it was saved (``Plan.model_dump_json(by_alias=True)`` of the saved plan).

        Raises: FtlError(not_found) naming the campaign or the missing version.
        """
        # One snapshot: a shared version and the task rows' specs must be read from the same
        # state, or a merge committed in between would mix the old row with the new specs.
        with self._session(snapshot=True) as conn:
            self._require_campaign(conn, campaign_id)
            if version is None:
                row = conn.execute(f"SELECT {_PLAN_TEXT_COLUMNS} FROM plan WHERE campaign_id = ? "
                                   "ORDER BY version DESC LIMIT 1", (campaign_id,)).fetchone()
            else:
                row = conn.execute(f"SELECT {_PLAN_TEXT_COLUMNS} FROM plan WHERE campaign_id = ? "
                                   "AND version = ?", (campaign_id, version)).fetchone()
            if row is None:
                what = "any plan" if version is None else f"plan version {version}"
                raise FtlError("not_found", {"what": f"{what} of campaign {campaign_id}"})
            return self._plan_text(conn, campaign_id, row)

    def plan_saved_at(self, campaign_id: str, version: int) -> str | None:
        """When plan ``version`` of the campaign was saved (RFC 3339 UTC), or None if unknown."""
        with self._session() as conn:
            row = conn.execute("SELECT created_at FROM plan WHERE campaign_id = ? AND version = ?",
                               (campaign_id, version)).fetchone()
        return None if row is None else row[0]

    def mark_plan_executed(self, campaign_id: str, version: int) -> str:
        """Mark plan ``version`` of the campaign executed (FTL ``plan.py mark-executed``); return
        when it was first marked (RFC 3339 UTC; marking again keeps the first time).

        Raises: FtlError(not_found) for an unknown campaign or version.
        """
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            conn.execute("UPDATE plan SET executed_at = COALESCE(executed_at, ?) WHERE campaign_id = ? "
                         "AND version = ?", (self._now(), campaign_id, version))
            row = conn.execute("SELECT executed_at FROM plan WHERE campaign_id = ? AND version = ?",
                               (campaign_id, version)).fetchone()
        if row is None:
            raise FtlError("not_found", {"what": f"plan version {version} of campaign {campaign_id}"})
        return row[0]

    def executed_plan_versions(self, campaign_id: str) -> set[int]:
        """The campaign's plan versions marked executed (`mark_plan_executed`)."""
        with self._session() as conn:
            return {r[0] for r in conn.execute("SELECT version FROM plan WHERE campaign_id = ? AND "
                                               "executed_at IS NOT NULL", (campaign_id,))}

    def plan_versions(self, campaign_id: str) -> list[int]:
        """The campaign's saved plan versions, ascending."""
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            return [r[0] for r in conn.execute(
                "SELECT version FROM plan WHERE campaign_id = ? ORDER BY version", (campaign_id,))]


    def plan_header(self, campaign_id: str, version: int | None = None) -> dict[str, Any]:
        """Every top-level field of plan ``version`` of the campaign (the latest by default) but
        ``tasks``, as saved (``by_alias`` keys, a plan's extra fields included), without decoding
        its task list (SQLite's ``json_remove`` drops it first).

        Raises: FtlError(not_found) naming the campaign or the missing version.
        """
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            if version is None:
                row = conn.execute("SELECT json_remove(plan, '$.tasks') FROM plan WHERE campaign_id = ? "
                                   "ORDER BY version DESC LIMIT 1", (campaign_id,)).fetchone()
            else:
                row = conn.execute("SELECT json_remove(plan, '$.tasks') FROM plan WHERE campaign_id = ? "
                                   "AND version = ?", (campaign_id, version)).fetchone()
        if row is None:
            what = "any plan" if version is None else f"plan version {version}"
            raise FtlError("not_found", {"what": f"{what} of campaign {campaign_id}"})
        return _loads(row[0])

    def latest_plan_fields(self, campaign_id: str, names: Sequence[str]) -> dict[str, Any]:
        """Top-level fields of the campaign's latest plan version, read by SQLite's JSON
        functions without decoding the plan (a 10,000-task plan is megabytes of JSON).

        Args:
            names: top-level field names of the stored plan (its ``by_alias`` JSON keys) whose
                values are scalars (an object or array would come back as JSON text); not
                ``tasks``, which a version shared with the task rows stores empty.

        Returns:
            ``{name: value}`` for every name (None when the field is null or absent); {} when
            the campaign has no plan.

        Raises: FtlError(not_found) for an unknown campaign.
        """
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            row = conn.execute(
                f"SELECT {', '.join('json_extract(plan, ?)' for _ in names)} FROM plan "
                "WHERE campaign_id = ? ORDER BY version DESC LIMIT 1",
                (*(f'$."{name}"' for name in names), campaign_id)).fetchone()
        return {} if row is None else dict(zip(names, row))
