"""Changes to a campaign's set of tasks: register a plan's tasks (add-tasks, with its batched
insert) and merge a re-plan into them, both after `check_plan_graph` has found the plan a DAG.
Add-tasks refuses to overwrite progress; a re-plan merge keeps complete tasks, takes the revised
spec for the others, adds new tasks and saves a new plan version.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from itertools import chain, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Sequence

import orjson

from ftl import dag
from ftl.errors import FtlError
from ftl.store.codec import _dumps, _violation
from ftl.store.tasks import _B, _C, _P, _R

if TYPE_CHECKING:  # the models (pydantic) load only where a plan or task is parsed or written
    from ftl.models import Plan, Task
    from ftl.plan_rows import PlanRows, TaskRow

#: Task rows per INSERT statement in add-tasks: 7 parameters each stay within 999, the lowest
#: limit a SQLite build may have (SQLITE_MAX_VARIABLE_NUMBER before 3.32).
_INSERT_BATCH = 140


def check_plan_graph(tasks: Sequence[Task] | Sequence[TaskRow]) -> None:
    """Reject a task list (`ftl.models.Task`s or `ftl.plan_rows.TaskRow`s: their ``seq`` and
    ``depends``) that is not a DAG over its own seqs.

    Order of checks (FTL add-tasks/merge, reference §6.3-6.4, plus duplicate seqs which FTL
    accepted, §8.2 item 12): duplicate seqs, then cycles, then dependencies on seqs outside the list.

    Raises:
        FtlError(schema_invalid): duplicate seqs or dangling dependencies; ``details.violations``
            names each task and dependency and the valid seqs.
        FtlError(cycle_detected): ``details.cycle`` is the path, e.g. ``"001 -> 002 -> 001"``
            (each task depends on the next).
    """
    seqs = [t.seq for t in tasks]
    graph = dict(zip(seqs, (t.depends for t in tasks)))
    if len(graph) != len(seqs):
        duplicates = sorted((seq for seq, n in Counter(seqs).items() if n > 1), key=int)
        raise FtlError("schema_invalid", {"count": len(duplicates), "violations": [
            {"path": f"tasks[seq={seq}].seq", "message": f"seq {seq} is used by more than one task"}
            for seq in duplicates]})
    cycle = dag.find_cycle(graph)
    if cycle:
        text = dag.format_cycle(cycle)
        # cycle[0] depends on cycle[1]: the path names that dependency, as the other checks do.
        raise FtlError("cycle_detected", {"cycle": text, "violations": [
            {"path": f"tasks[seq={cycle[0]}].depends", "message": f"dependency cycle {text}"}]})
    missing = dag.dangling(graph)
    if missing:
        valid = ", ".join(sorted(graph, key=int))
        raise FtlError("schema_invalid", {"count": len(missing), "violations": [
            {"path": f"tasks[seq={seq}].depends",
             "message": f"task {seq} depends on {dep}, which is not in the plan (valid seqs: {valid})"}
            for seq, dep in missing]})


class TaskSetMixin:
    """`ftl.store.Store`'s add-tasks and re-plan merge. Uses the store's ``_session``, ``_now``
    and ``_foreign_keys_unchecked``, `CampaignsMixin._active_row`, `TasksMixin._task_rows` and
    the plan versions of `PlanVersionsMixin`."""

    @staticmethod
    def _insert_task(conn: sqlite3.Connection, campaign_id: str, task: Task, now: str) -> None:
        conn.execute(
            "INSERT INTO task (campaign_id, seq, slug, type, depends, status, spec, updated_at) "
            "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?)",
            (campaign_id, task.seq, task.slug, task.type.value, _dumps(task.depends, "depends"),
             task.model_dump_json(), now))

    @staticmethod
    def _insert_task_rows(conn: sqlite3.Connection, campaign_id: str, tasks: Sequence[TaskRow],
                          now: str) -> None:
        """Insert ``tasks`` as pending rows, `_INSERT_BATCH` rows per statement.

        A multi-row ``INSERT ... VALUES`` binds and steps once per batch instead of once per row
        (executemany: 10,000 rows in 31-37 ms of CPU, batches: 25-30). The parameters come from
        C-level iterators over the rows' fields (no Python frame per row); orjson writes a depends
        tuple as `_seqs_json` does (canonical seqs are digits: nothing to escape).

        ``OR ROLLBACK``: no row can conflict (the caller found the campaign without tasks in this
        transaction and the seqs unique; keys and CHECKs hold by construction), and a statement
        that may only fail whole needs no statement journal. With SQLite's default ABORT each
        batch first copied the pages it would change to a temporary file, 10,000 rows: about 740
        page writes to /var/tmp (1,470 system calls) of a transaction that rolls back whole anyway.
        """
        values = list(chain.from_iterable(zip(
            repeat(campaign_id), map(attrgetter("seq"), tasks), map(attrgetter("slug"), tasks),
            map(attrgetter("type"), tasks), map(bytes.decode, map(orjson.dumps, map(attrgetter("depends"), tasks))),
            map(attrgetter("spec"), tasks), repeat(now))))
        width = 7 * _INSERT_BATCH

        def statement(count: int) -> str:
            return ("INSERT OR ROLLBACK INTO task (campaign_id, seq, slug, type, depends, status, spec, updated_at) "
                    "VALUES "
                    + ",".join(["(?, ?, ?, ?, ?, 'pending', ?, ?)"] * count))

        full = statement(_INSERT_BATCH)  # one text: prepared once, then from the statement cache
        for start in range(0, len(values), width):
            batch = values[start:start + width]
            conn.execute(full if len(batch) == width else statement(len(batch) // 7), batch)

    def add_tasks(self, campaign_id: str, plan: Plan | PlanRows) -> list[str]:
        """Register the plan's tasks as pending rows (REGISTER); return their seqs in seq order.

        ``plan`` is a `ftl.models.Plan` or, for big plans, the `ftl.plan_rows.PlanRows` of
        `ftl.plan_rows.plan_rows` (a 10,000-task plan then registers in under 40 MiB, issue 11
        item 4). The plan is saved as a new version unless it equals the latest saved one, and
        becomes the campaign's framework if the campaign has none. Unlike FTL add-tasks, which
        replaced the task list and so reset progress (§8.2 item 12), a second call is refused.

        Raises:
            FtlError(conflict): the campaign already has tasks, or is not active.
            FtlError(schema_invalid): duplicate seqs or dangling dependencies (nothing saved).
            FtlError(cycle_detected): the dependencies form a cycle (nothing saved).
            FtlError(not_found): unknown campaign.
        """
        from ftl.plan_rows import PlanRows

        rows = plan if isinstance(plan, PlanRows) else PlanRows.from_plan(plan)
        if not rows.graph_checked:  # the lean validation checked it already (10,000 tasks: 15 ms)
            check_plan_graph(rows.tasks)
        with self._foreign_keys_unchecked(), self._session(write=True) as conn:
            campaign = self._active_row(conn, campaign_id, "add tasks")
            count = conn.execute("SELECT COUNT(*) FROM task WHERE campaign_id = ?", (campaign_id,)).fetchone()[0]
            if count:
                raise FtlError("conflict", {"what": f"Campaign {campaign_id} already has {count} tasks; "
                                                    "change them with a re-plan merge, not add-tasks."})
            now = self._now()
            if not self._is_latest_plan(conn, campaign_id, rows.plan_json):
                self._insert_registered_plan(conn, campaign_id, rows, now)
            if campaign["framework"] is None and rows.framework is not None:
                conn.execute("UPDATE campaign SET framework = ?, updated_at = ? WHERE campaign_id = ?",
                             (rows.framework, now, campaign_id))
            # The rows' status is the literal 'pending' and attempts takes its default 0, so the
            # table's CHECKs hold by construction; SQLite would still evaluate `status IN (...)`
            # per row, half of this insert's time (10,000 rows: 18 of 38 ms).
            conn.execute("PRAGMA ignore_check_constraints = ON")
            cache = None  # the connection's page cache setting, when the insert changed it
            try:  # from here on, whatever raises, the finally puts both settings back
                # A page cache that holds every page the transaction writes: past the default
                # 2 MB SQLite spills dirty pages to the WAL before the commit and writes each
                # again when the next rows land on it (10,000 rows, 4 MB of pages: 450 extra
                # frame writes and 480 reads back). A negative size is in KiB.
                wanted = -2 * (sum(map(len, map(attrgetter("spec"), rows.tasks))) >> 10)
                current = conn.execute("PRAGMA cache_size").fetchone()[0]
                if wanted < current < 0:
                    conn.execute(f"PRAGMA cache_size = {wanted}")
                    cache = current
                self._insert_task_rows(conn, campaign_id, rows.tasks, now)
            finally:
                conn.execute("PRAGMA ignore_check_constraints = OFF")
                if cache is not None:
                    conn.execute(f"PRAGMA cache_size = {cache}")
        return sorted(map(attrgetter("seq"), rows.tasks), key=int)


    def merge_revised_plan(self, campaign_id: str, revised: Plan, *, max_new_tasks: int,
                           tracked: dict | None = None) -> dict:
        """Merge a re-plan into the campaign's tasks and save the result as a new plan version.

        Rules (FTL merge-revised-plan §6.8, with §8.2 item 8 fixed): complete and running tasks
        never change; a blocked task present in the revision takes its revised spec (every field)
        and becomes pending; a pending task present in the revision takes the revised spec (counted
        as merged only if it differs); tasks absent from the revision are unchanged; seqs new to
        the campaign are added as pending, at most ``max_new_tasks`` (config
        ``max_replan_new_tasks``). The merged graph is checked before anything is written. The
        saved plan has the revision's header (objective, framework, idioms) and the merged tasks
        (existing in seq order, then new ones in revision order).

        ``tracked``, when given, replaces the campaign's tracked variables in the same
        transaction (`save_machine`'s ``tracked``): the runner records the re-plan count and that
        a merge is waiting to be executed together with the merge, so a crash right after it
        cannot lose the outcome.

        Returns: ``{"merged": n, "unchanged": m, "added": k, "plan_version": v}``.
        Raises:
            FtlError(schema_invalid): too many new tasks, duplicate seqs in the revision, a
                dependency on a seq that is in neither, or ``tracked`` that is not a JSON object
                (nothing saved).
            FtlError(cycle_detected): the merged graph has a cycle (nothing saved).
            FtlError(conflict): the campaign is not active or has no tasks yet.
            FtlError(not_found): unknown campaign.
        """
        if tracked is not None and not isinstance(tracked, dict):
            raise _violation("tracked", "must be a JSON object")
        encoded_tracked = None if tracked is None else _dumps(tracked, "tracked")
        from ftl.models import Task as task_model
        by_seq: dict[str, Task] = {}
        for task in revised.tasks:
            if task.seq in by_seq:
                raise _violation(f"tasks[seq={task.seq}].seq", f"seq {task.seq} is used by more than one task")
            by_seq[task.seq] = task
        with self._session(write=True) as conn:
            self._active_row(conn, campaign_id, "merge a revised plan")
            rows = self._task_rows(conn, campaign_id)
            if not rows:
                raise FtlError("conflict", {"what": f"Campaign {campaign_id} has no tasks to merge into; "
                                                    "register the plan first."})
            self._materialise_plans(conn, campaign_id)  # before any spec or the task set changes
            merged_tasks: list[Task] = []
            reopened: list[tuple[Task, bool]] = []  # (revised task, was blocked)
            unchanged = 0
            for row in rows:
                current = task_model.model_validate_json(row["spec"])
                new = by_seq.get(row["seq"])
                status = row["status"]
                if new is None or status in (_C, _R) or (status == _P and new == current):
                    unchanged += 1
                    merged_tasks.append(current)
                    continue
                reopened.append((new, status == _B))
                merged_tasks.append(new)
            existing = {row["seq"] for row in rows}
            added = [t for t in revised.tasks if t.seq not in existing]
            if len(added) > max_new_tasks:
                raise _violation("tasks", f"the revision adds {len(added)} new tasks; the limit is "
                                          f"{max_new_tasks} (max_replan_new_tasks)")
            merged_tasks.extend(added)
            check_plan_graph(merged_tasks)
            now = self._now()
            version = self._insert_plan(conn, campaign_id, revised.model_copy(update={"tasks": merged_tasks}), now)
            for task, was_blocked in reopened:
                clear = ", finished_at = NULL, delivered = NULL" if was_blocked else ""
                conn.execute(
                    "UPDATE task SET slug = ?, type = ?, depends = ?, spec = ?, status = 'pending', "
                    f"blocked_by = '[]', block_reason = NULL{clear}, revised_at = ?, updated_at = ? "
                    "WHERE campaign_id = ? AND seq = ?",
                    (task.slug, task.type.value, _dumps(task.depends, "depends"), task.model_dump_json(),
                     now, now, campaign_id, task.seq))
            for task in added:
                self._insert_task(conn, campaign_id, task, now)
            if encoded_tracked is not None:
                conn.execute("UPDATE campaign SET tracked = ?, updated_at = ? WHERE campaign_id = ?",
                             (encoded_tracked, now, campaign_id))
        return {"merged": len(reopened), "unchanged": unchanged, "added": len(added), "plan_version": version}
