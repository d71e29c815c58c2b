"""Workspace rows: one per task attempt, moving active -> built -> an end status
(`WORKSPACE_TRANSITIONS`). Ids are unique per campaign and attempt.
"""

from __future__ import annotations

import sqlite3

from ftl.errors import FtlError
from ftl.store.codec import _dumps, _loads, _seq, _violation

WORKSPACE_END_STATUSES = ("complete", "blocked", "cancelled", "abandoned")
#: Workspace attempt lifecycle: active -> built (build done, verify pending; a resume re-verifies
#: instead of rebuilding) -> an end status; or active -> an end status directly.
WORKSPACE_TRANSITIONS: dict[str, tuple[str, ...]] = {
    "active": ("built",) + WORKSPACE_END_STATUSES,
    "built": WORKSPACE_END_STATUSES,
}


# status -> the statuses it may be reached from (`WORKSPACE_TRANSITIONS` read backwards).
_SOURCES: dict[str, tuple[str, ...]] = {
    target: tuple(source for source, targets in WORKSPACE_TRANSITIONS.items() if target in targets)
    for target in {t for targets in WORKSPACE_TRANSITIONS.values() for t in targets}}


class WorkspacesMixin:
    """`ftl.store.Store`'s workspace rows. Uses the store's ``_session`` and ``_now`` and
    `CampaignsMixin._campaign_row`."""

    @staticmethod
    def _workspace_dict(row: sqlite3.Row) -> dict:
        return {
            "campaign_id": row["campaign_id"], "workspace_id": row["workspace_id"], "seq": row["seq"],
            "attempt": row["attempt"], "status": row["status"], "spec": _loads(row["spec"]),
            "result": _loads(row["result"]), "created_at": row["created_at"],
            "finished_at": row["finished_at"],
        }

    def record_workspace(self, campaign_id: str, workspace: dict, *, built: dict | None = None) -> None:
        """Record one attempt's workspace as ``active``. ``workspace`` needs ``workspace_id``,
        ``seq`` and ``attempt`` (int >= 1); the whole dict is kept as ``spec``. Ids are unique per
        campaign and attempt (FTL's were global and re-used across attempts, §8.2 item 14).

        ``built``: record the attempt directly as ``built`` with this result (an attempt that
        reuses an earlier attempt's finished build), in the same statement, so no crash leaves
        it ``active`` and the checkpoint lost.

        Raises:
            FtlError(schema_invalid): a required key is missing or malformed, or ``built`` is
                not a JSON object.
            FtlError(conflict): this (workspace_id, attempt) is already recorded.
            FtlError(not_found): unknown campaign.
        """
        if not isinstance(workspace, dict):
            raise _violation("workspace", "must be a JSON object")
        workspace_id = workspace.get("workspace_id")
        if not isinstance(workspace_id, str) or not workspace_id:
            raise _violation("workspace.workspace_id", "must be a non-empty string")
        if "seq" not in workspace:
            raise _violation("workspace.seq", "is required")
        seq = _seq(workspace["seq"], "workspace.seq")
        attempt = workspace.get("attempt")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise _violation("workspace.attempt", "must be an integer >= 1")
        status = workspace.get("status", "active")
        if status != "active":
            raise _violation("workspace.status", f"a new workspace is 'active', got {status!r}")
        if built is not None and not isinstance(built, dict):
            raise _violation("built", "must be a JSON object or None")
        spec = {k: v for k, v in workspace.items() if k != "status"}
        encoded = _dumps(spec, "workspace")
        status, result = ("active", None) if built is None else ("built", _dumps(built, "built"))
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            now = self._now()
            try:  # the primary key refuses a second row: no look-up first (every task records one)
                conn.execute("INSERT INTO workspace (campaign_id, workspace_id, seq, attempt, status, spec, "
                             "result, created_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (campaign_id, workspace_id, seq, attempt, status, encoded, result, now,
                              None if built is None else now))
            except sqlite3.IntegrityError as exc:
                if exc.sqlite_errorname != "SQLITE_CONSTRAINT_PRIMARYKEY":
                    raise  # another constraint (a campaign row gone): the session words it
                raise FtlError("conflict", {"what": f"Workspace {workspace_id} attempt {attempt} of campaign "
                                                    f"{campaign_id} is already recorded."}) from None

    def finish_workspace(self, campaign_id: str, workspace_id: str, attempt: int, status: str,
                         result: dict) -> None:
        """Move a workspace attempt along `WORKSPACE_TRANSITIONS` and store its ``result``
        (build/verify outcome): ``built`` checkpoints a finished build before verify; complete,
        blocked, cancelled and abandoned end the attempt. FTL accepted any order (§5.3).

        Raises:
            FtlError(schema_invalid): unknown status or non-JSON result.
            FtlError(not_found): unknown campaign or workspace attempt.
            FtlError(invalid_state): ``{"trigger": "<from>-><to>", "state": "<from>"}`` when the
                attempt already ended (or is already built and ``status`` is built).
        """
        allowed = ("built",) + WORKSPACE_END_STATUSES
        if status not in allowed:
            raise _violation("status", f"must be one of {', '.join(allowed)}, got {status!r}")
        encoded = _dumps(result, "result")
        sources = _SOURCES[status]
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            # The transition's check is the update's own condition; the row is read only to
            # word a refusal (in the same transaction).
            if conn.execute(f"UPDATE workspace SET status = ?, result = ?, finished_at = ? WHERE campaign_id = ? "
                            f"AND workspace_id = ? AND attempt = ? AND status IN ({','.join('?' * len(sources))})",
                            (status, encoded, self._now(), campaign_id, workspace_id, attempt,
                             *sources)).rowcount:
                return
            row = conn.execute("SELECT status FROM workspace WHERE campaign_id = ? AND workspace_id = ? "
                               "AND attempt = ?", (campaign_id, workspace_id, attempt)).fetchone()
            if row is None:
                raise FtlError("not_found", {"what": f"workspace {workspace_id} attempt {attempt} of "
                                                     f"campaign {campaign_id}"})
            raise FtlError("invalid_state", {"trigger": f"{row[0]}->{status}", "state": row[0]})

    def workspaces(self, campaign_id: str, seq: str | None = None) -> list[dict]:
        """Workspace attempts ``{campaign_id, workspace_id, seq, attempt, status, spec, result,
        created_at, finished_at}`` in seq then attempt order, optionally for one seq."""
        query = "SELECT * FROM workspace WHERE campaign_id = ?"
        args: tuple = (campaign_id,)
        if seq is not None:
            query += " AND seq = ?"
            args += (_seq(seq),)
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            rows = conn.execute(query + " ORDER BY CAST(seq AS INTEGER), attempt, workspace_id", args).fetchall()
        return [self._workspace_dict(r) for r in rows]
