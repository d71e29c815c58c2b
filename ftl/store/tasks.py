"""Task rows and their status machine: read tasks, the ready set and the DAG's input, and move
one task along a legal transition (`_TRANSITIONS`) in one ``BEGIN IMMEDIATE`` transaction, so
two processes can neither lose an update nor both start the same task. What changes the task
set or the specs (add-tasks, the re-plan merge) is `ftl.store.task_set`.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Sequence

from ftl import dag
from ftl.errors import FtlError
from ftl.store.codec import _dumps, _loads, _seq

if TYPE_CHECKING:  # the models (pydantic) load only where a task is parsed or written
    from ftl.models import TaskStatus

_SQL_BATCH = 500  # bound parameters per IN (...) query, far below SQLite's limit

# Status texts (`ftl.models.TaskStatus` values): reading rows never needs the models.
_P, _R, _C, _B = dag.PENDING, dag.RUNNING, dag.COMPLETE, dag.BLOCKED

#: Legal task transitions (status texts) -> the ``reason`` they require (None: any reason).
#: Everything else is ``invalid_state``. Source: ftl design (§8.3 item 11 of the FTL reference); FTL's update-task
#: accepted any status string (§8.2 item 11).
_TRANSITIONS: dict[tuple[str, str], str | None] = {
    (_P, _R): None,        # the scheduler starts a ready task
    (_R, _C): None,        # verified
    (_R, _B): None,        # the attempt failed structurally
    (_P, _B): None,        # cascade propagation: a dependency is blocked
    (_B, _P): "replan",    # re-opened by a re-plan merge
    (_R, _P): "resume",    # in-flight attempt discarded after a crash
}


class TasksMixin:
    """`ftl.store.Store`'s task rows. Uses the store's ``_session`` and ``_now`` and
    `CampaignsMixin._campaign_row`."""

    @staticmethod
    def _task_dict(row: sqlite3.Row) -> dict:
        return {
            "seq": row["seq"], "slug": row["slug"], "type": row["type"],
            "depends": _loads(row["depends"]), "status": row["status"], "attempts": row["attempts"],
            "blocked_by": _loads(row["blocked_by"]), "block_reason": row["block_reason"],
            "delivered": row["delivered"], "spec": _loads(row["spec"]),
            "started_at": row["started_at"], "finished_at": row["finished_at"],
            "updated_at": row["updated_at"], "revised_at": row["revised_at"], "worker": row["worker"],
        }

    @staticmethod
    def _task_rows(conn: sqlite3.Connection, campaign_id: str) -> list[sqlite3.Row]:
        return conn.execute("SELECT * FROM task WHERE campaign_id = ? ORDER BY CAST(seq AS INTEGER)",
                            (campaign_id,)).fetchall()

    def _task_row(self, conn: sqlite3.Connection, campaign_id: str, seq: str) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM task WHERE campaign_id = ? AND seq = ?",
                           (campaign_id, seq)).fetchone()
        if row is None:
            self._require_campaign(conn, campaign_id)
            raise FtlError("not_found", {"what": f"task {seq} of campaign {campaign_id}"})
        return row


    def tasks(self, campaign_id: str, seqs: Sequence[str] | None = None) -> list[dict]:
        """Task dicts of the campaign in seq order: ``{seq, slug, type, depends, status,
        attempts, blocked_by, block_reason, delivered, spec, started_at, finished_at, updated_at,
        revised_at, worker}`` (``spec`` is the Task as JSON); all of them, or only ``seqs``
        (canonical seqs; unknown ones are skipped). Raises: FtlError(not_found)."""
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            if seqs is None:
                return [self._task_dict(r) for r in self._task_rows(conn, campaign_id)]
            wanted = list(dict.fromkeys(seqs))  # the rows are sorted below, once
            rows: list[dict] = []
            for start in range(0, len(wanted), _SQL_BATCH):
                batch = wanted[start:start + _SQL_BATCH]
                rows += [self._task_dict(r) for r in conn.execute(
                    f"SELECT * FROM task WHERE campaign_id = ? AND seq IN ({','.join('?' * len(batch))})",
                    (campaign_id, *batch))]
            rows.sort(key=lambda r: dag.seq_key(r["seq"]))
            return rows

    def ready_tasks(self, campaign_id: str) -> list[dict]:
        """The ready set as task dicts (see `tasks`), in seq order: pending tasks whose every
        dependency is complete (`ftl.dag.ready_set`; a dependency that is not a task of the
        campaign is never complete). Computed by SQLite, which reads each pending task's
        dependencies through the primary key: no Python pass over the whole DAG (a
        10,000-task plan: one query instead of the graph, a Python pass and a second read).
        Raises: FtlError(not_found)."""
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            rows = conn.execute(
                "SELECT * FROM task AS t WHERE t.campaign_id = ? AND t.status = 'pending' "
                "AND NOT EXISTS (SELECT 1 FROM json_each(t.depends) AS d "
                "LEFT JOIN task AS u ON u.campaign_id = t.campaign_id AND u.seq = d.value "
                "WHERE u.status IS NOT 'complete') ORDER BY CAST(t.seq AS INTEGER)",
                (campaign_id,)).fetchall()
        return [self._task_dict(r) for r in rows]

    def task_graph(self, campaign_id: str) -> tuple[dict[str, list[str]], dict[str, str]]:
        """``(depends, status)``: seq -> its dependencies and seq -> its status, the input of
        every `ftl.dag` function, read without the task specs (a 10,000-task plan: 3 columns
        instead of 15, no spec JSON decoded). Raises: FtlError(not_found)."""
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            rows = conn.execute("SELECT seq, depends, status FROM task WHERE campaign_id = ? "
                                "ORDER BY CAST(seq AS INTEGER)", (campaign_id,)).fetchall()
        return {r[0]: _loads(r[1]) for r in rows}, {r[0]: r[2] for r in rows}

    def blocked_seqs(self, campaign_id: str) -> list[str]:
        """Seqs of the campaign's blocked tasks, in seq order, from the ``task_blocked`` index
        (its size is the number of blocked tasks, not of all tasks: BUILD asks for every task).
        Raises: FtlError(not_found)."""
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            rows = conn.execute("SELECT seq FROM task INDEXED BY task_blocked WHERE campaign_id = ? "
                                "AND status = 'blocked'", (campaign_id,)).fetchall()
        return sorted((r[0] for r in rows), key=dag.seq_key)

    def task(self, campaign_id: str, seq: str) -> dict:
        """One task dict (see `tasks`). Raises: FtlError(not_found) for the campaign or seq."""
        wanted = _seq(seq)
        with self._session() as conn:
            return self._task_dict(self._task_row(conn, campaign_id, wanted))

    def counts(self, campaign_id: str) -> dict[str, int]:
        """Number of tasks per status: ``{pending, running, complete, blocked, total}``."""
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            rows = conn.execute("SELECT status, COUNT(*) FROM task WHERE campaign_id = ? GROUP BY status",
                                (campaign_id,)).fetchall()
        result = dict.fromkeys(dag.STATUSES, 0)
        result.update({r[0]: r[1] for r in rows})
        result["total"] = sum(r[1] for r in rows)
        return result

    def place_task(self, campaign_id: str, seq: str, worker: str) -> bool:
        """Say where a running task's attempt runs (its ``worker``, e.g. ``"w2 @ node
        8242c3f210a1 (pid 4242 on host)"``, once a cluster placed it; issue 14).

        Returns:
            True when the task was running and its row now says so; False otherwise (the
            task ended meanwhile: nothing changes).
        """
        with self._session(write=True) as conn:
            return conn.execute(
                "UPDATE task SET worker = ? WHERE campaign_id = ? AND seq = ? AND status = 'running'",
                (worker, campaign_id, _seq(seq))).rowcount == 1

    def transition_task(self, campaign_id: str, seq: str, to: TaskStatus | str, *,
                        reason: str | None = None, blocked_by: list[str] | None = None,
                        delivered: str | None = None, worker: str | None = None) -> dict:
        """Move one task along a legal transition (`TRANSITIONS`) atomically; return the new dict.

        Effects: pending->running increments ``attempts``, sets ``started_at`` and ``worker`` and
        needs every dependency complete; ->complete and ->blocked set ``finished_at`` and
        ``delivered``; ->blocked records ``reason`` as ``block_reason`` and ``blocked_by``
        (canonical seqs); blocked->pending (``reason="replan"``) clears the block;
        running->pending (``reason="resume"``) clears the worker. The read and the write share
        one BEGIN IMMEDIATE transaction, so of two processes starting the same task exactly one
        succeeds.

        Raises:
            FtlError(invalid_state): ``{"trigger": "<from>-><to>", "state": "<from>"}`` for an
                illegal transition, a missing required reason, an unknown target status, or a
                start whose dependencies are not all complete.
            FtlError(not_found): unknown campaign or seq.
            FtlError(schema_invalid): a ``blocked_by`` entry that is not a seq.
        """
        wanted = _seq(seq)
        parents = [_seq(s, "blocked_by") for s in blocked_by or []]
        with self._session(write=True) as conn:
            row = self._task_row(conn, campaign_id, wanted)
            current = row["status"]
            target = str(getattr(to, "value", to))  # a TaskStatus member or its text
            trigger = {"trigger": f"{current}->{target}", "state": current}
            if target not in dag.STATUSES:
                raise FtlError("invalid_state", trigger)
            if (current, target) not in _TRANSITIONS:
                raise FtlError("invalid_state", trigger)
            needed = _TRANSITIONS[(current, target)]
            if needed is not None and reason != needed:
                raise FtlError("invalid_state", trigger, message=(
                    f"Task {wanted} may go {current} -> {target} only with reason "
                    f"'{needed}'."))
            now = self._now()
            if target == _R:
                deps = _loads(row["depends"])
                open_deps = [d for d in deps if (conn.execute(
                    "SELECT status FROM task WHERE campaign_id = ? AND seq = ?", (campaign_id, d)).fetchone()
                    or ["missing"])[0] != "complete"]
                if open_deps:
                    raise FtlError("invalid_state", trigger, message=(
                        f"Task {wanted} cannot start: dependencies {', '.join(open_deps)} are not complete."))
                conn.execute("UPDATE task SET status = 'running', attempts = attempts + 1, started_at = ?, "
                             "finished_at = NULL, worker = ?, blocked_by = '[]', block_reason = NULL, "
                             "delivered = NULL, updated_at = ? WHERE campaign_id = ? AND seq = ?",
                             (now, worker, now, campaign_id, wanted))
            elif target == _C:
                conn.execute("UPDATE task SET status = 'complete', finished_at = ?, delivered = ?, "
                             "updated_at = ? WHERE campaign_id = ? AND seq = ?",
                             (now, delivered, now, campaign_id, wanted))
            elif target == _B:
                conn.execute("UPDATE task SET status = 'blocked', finished_at = ?, delivered = ?, "
                             "block_reason = ?, blocked_by = ?, updated_at = ? WHERE campaign_id = ? AND seq = ?",
                             (now, delivered, reason, _dumps(parents, "blocked_by"), now, campaign_id, wanted))
            elif current == _B:  # replan
                conn.execute("UPDATE task SET status = 'pending', blocked_by = '[]', block_reason = NULL, "
                             "finished_at = NULL, delivered = NULL, updated_at = ? "
                             "WHERE campaign_id = ? AND seq = ?", (now, campaign_id, wanted))
            else:  # resume
                conn.execute("UPDATE task SET status = 'pending', worker = NULL, started_at = NULL, "
                             "updated_at = ? WHERE campaign_id = ? AND seq = ?", (now, campaign_id, wanted))
            return self._task_dict(self._task_row(conn, campaign_id, wanted))

    def reset_running(self, campaign_id: str) -> list[str]:
        """Resume after a crash: every running task goes back to pending (``reason="resume"``) and
        every still-active workspace of the campaign becomes ``abandoned``, in one transaction.
        ``built`` workspaces are kept, so the resumed attempt can verify instead of rebuilding.

        Returns: the seqs that were running, in seq order. Raises: FtlError(not_found).
        """
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            seqs = [r[0] for r in conn.execute(
                "SELECT seq FROM task WHERE campaign_id = ? AND status = 'running' ORDER BY CAST(seq AS INTEGER)",
                (campaign_id,))]
            now = self._now()
            conn.execute("UPDATE task SET status = 'pending', worker = NULL, started_at = NULL, updated_at = ? "
                         "WHERE campaign_id = ? AND status = 'running'", (now, campaign_id))
            conn.execute("UPDATE workspace SET status = 'abandoned', finished_at = ?, result = ? "
                         "WHERE campaign_id = ? AND status = 'active'",
                         (now, _dumps({"reason": "resume"}, "result"), campaign_id))
        return seqs
