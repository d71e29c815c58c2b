"""Campaign rows: create, read, list and finish a campaign, and keep its machine state, tracked
variables and run inputs. At most one campaign is active (a unique partial index); a finished
row is the archive, with its tasks, plans and summary.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ftl.errors import FtlError
from ftl.store.codec import _dumps, _loads, _violation, format_ts

if TYPE_CHECKING:  # the models (pydantic) load only where a plan is written
    from ftl.models import Plan

CAMPAIGN_STATUSES = ("active", "complete", "returned", "cancelled")
FINISHED_STATUSES = ("complete", "returned", "cancelled")
FLOWS = ("campaign", "task")


class CampaignsMixin:
    """`ftl.store.Store`'s campaign rows. Uses the store's ``_session``, ``_clock`` and ``_now``,
    and `PlanVersionsMixin._insert_plan` for a campaign created with its plan."""

    @staticmethod
    def _campaign_dict(row: sqlite3.Row) -> dict:
        return {
            "campaign_id": row["campaign_id"], "id": row["campaign_id"], "objective": row["objective"],
            "flow": row["flow"], "status": row["status"], "framework": row["framework"],
            "machine_state": row["machine_state"], "tracked": _loads(row["tracked"]) or {},
            "error": _loads(row["error"]), "inputs": _loads(row["inputs"]) or {},
            "summary": _loads(row["summary"]), "created_at": row["created_at"],
            "updated_at": row["updated_at"], "finished_at": row["finished_at"],
        }

    def _campaign_row(self, conn: sqlite3.Connection, campaign_id: str) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM campaign WHERE campaign_id = ?", (campaign_id,)).fetchone()
        if row is None:
            raise FtlError("not_found", {"what": f"campaign {campaign_id}"})
        return row

    def _require_campaign(self, conn: sqlite3.Connection, campaign_id: str) -> None:
        """Raise FtlError(not_found) unless the campaign exists. A campaign once found is
        remembered (ftl never deletes one), so a task's store calls do not each ask again."""
        if campaign_id not in self._campaigns_seen:
            self._campaign_row(conn, campaign_id)
            self._campaigns_seen.add(campaign_id)

    def _active_row(self, conn: sqlite3.Connection, campaign_id: str, action: str) -> sqlite3.Row:
        row = self._campaign_row(conn, campaign_id)
        if row["status"] != "active":
            raise FtlError("conflict", {"what": f"Cannot {action}: campaign {campaign_id} is "
                                                f"{row['status']}, not active."})
        return row

    def _new_campaign_id(self, moment: datetime) -> str:
        utc = moment.astimezone(timezone.utc) if moment.tzinfo else moment
        import secrets

        return f"c-{utc:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"

    def create_campaign(self, objective: str, *, flow: str = "campaign", plan: Plan | None = None,
                        framework: str | None = None, inputs: dict | None = None) -> dict:
        """Create the active campaign; with ``plan``, also save it as plan version 1.

        The id is ``c-YYYYMMDD-HHMMSS-xxxx`` (UTC time, 4 random hex digits), so ids sort by
        creation time. ``framework`` defaults to the plan's. ``inputs`` (what the run was started
        with, see `save_inputs`) is written in the same transaction, so no crash can leave an
        active campaign that a resume cannot rebuild.

        Returns: the campaign dict (`get_campaign`).
        Raises:
            FtlError(conflict): another campaign is active (FTL allowed one active campaign but
                crashed on the second create, §8.2 item 2; here the message names the active one).
            FtlError(schema_invalid): empty objective, unknown flow (campaign|task), or
                ``inputs`` that is not a JSON object.
        """
        if not objective or not objective.strip():
            raise _violation("objective", "must be a non-empty string")
        if flow not in FLOWS:
            raise _violation("flow", f"must be one of {', '.join(FLOWS)}, got {flow!r}")
        if inputs is not None and not isinstance(inputs, dict):
            raise _violation("inputs", "must be a JSON object")
        encoded_inputs = None if inputs is None else _dumps(inputs, "inputs")
        if framework is None and plan is not None:
            framework = plan.framework
        with self._session(write=True) as conn:
            active = conn.execute("SELECT campaign_id FROM campaign WHERE status = 'active'").fetchone()
            if active is not None:
                raise FtlError("conflict", {"what": f"Campaign {active[0]} is still active; finish or "
                                                    "cancel it before starting another."})
            moment = self._clock()
            now = format_ts(moment)
            for _ in range(8):  # random suffix collision within one second: draw again
                campaign_id = self._new_campaign_id(moment)
                if conn.execute("SELECT 1 FROM campaign WHERE campaign_id = ?", (campaign_id,)).fetchone() is None:
                    break
            conn.execute(
                "INSERT INTO campaign (campaign_id, objective, flow, status, framework, tracked, "
                "inputs, created_at, updated_at) VALUES (?, ?, ?, 'active', ?, '{}', ?, ?, ?)",
                (campaign_id, objective, flow, framework, encoded_inputs, now, now))
            if plan is not None:
                self._insert_plan(conn, campaign_id, plan, now)
            return self._campaign_dict(self._campaign_row(conn, campaign_id))

    def get_campaign(self, campaign_id: str) -> dict:
        """The campaign dict: ``{campaign_id, id (= campaign_id), objective, flow, status,
        framework, machine_state, tracked, error, inputs, summary, created_at, updated_at,
        finished_at}``.

        Raises: FtlError(not_found) ``{"what": "campaign <id>"}``.
        """
        with self._session() as conn:
            return self._campaign_dict(self._campaign_row(conn, campaign_id))

    def active_campaign(self) -> dict | None:
        """The campaign with status ``active``, or None."""
        with self._session() as conn:
            row = conn.execute("SELECT * FROM campaign WHERE status = 'active'").fetchone()
        return None if row is None else self._campaign_dict(row)

    def latest_campaign(self) -> dict | None:
        """The newest campaign of any status, or None."""
        found = self.list_campaigns()
        return found[0] if found else None

    def list_campaigns(self, status: str | None = None) -> list[dict]:
        """Campaigns, newest first, optionally only those with ``status``.

        Raises: FtlError(schema_invalid) for a status outside active|complete|returned|cancelled.
        """
        if status is not None and status not in CAMPAIGN_STATUSES:
            raise _violation("status", f"must be one of {', '.join(CAMPAIGN_STATUSES)}, got {status!r}")
        query = "SELECT * FROM campaign"
        args: tuple = ()
        if status is not None:
            query += " WHERE status = ?"
            args = (status,)
        with self._session() as conn:
            rows = conn.execute(query + " ORDER BY created_at DESC, rowid DESC", args).fetchall()
        return [self._campaign_dict(r) for r in rows]

    def save_machine(self, campaign_id: str, state: str, tracked: dict, *,
                     error: dict | None = None) -> None:
        """Persist the machine's current state, tracked variables (clarify_count,
        iteration_count, prior_ready_count, replan_count, ...) and pending error in one write
        (FTL kept them only in the model's context, §8.3 item 1). ``tracked`` and ``error``
        (``{error_type, details, origin}``, origin the state that failed; or None) replace the
        previous values.

        Raises: FtlError(not_found); FtlError(schema_invalid) when either is not a JSON object.
        """
        if not isinstance(tracked, dict):
            raise _violation("tracked", "must be a JSON object")
        if error is not None and not isinstance(error, dict):
            raise _violation("error", "must be a JSON object or None")
        encoded = _dumps(tracked, "tracked")
        encoded_error = None if error is None else _dumps(error, "error")
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            conn.execute("UPDATE campaign SET machine_state = ?, tracked = ?, error = ?, updated_at = ? "
                         "WHERE campaign_id = ?", (state, encoded, encoded_error, self._now(), campaign_id))

    def save_inputs(self, campaign_id: str, inputs: dict) -> None:
        """Keep what the run was started with (e.g. ``{plan_input, revised_plan_input}``) so a
        resume can rebuild it; replaces the previous dict.

        Raises: FtlError(not_found); FtlError(schema_invalid) when ``inputs`` is not a JSON object.
        """
        if not isinstance(inputs, dict):
            raise _violation("inputs", "must be a JSON object")
        encoded = _dumps(inputs, "inputs")
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            conn.execute("UPDATE campaign SET inputs = ?, updated_at = ? WHERE campaign_id = ?",
                         (encoded, self._now(), campaign_id))

    def set_framework(self, campaign_id: str, framework: str | None) -> None:
        """Set the campaign's framework (from exploration or the plan). Raises: FtlError(not_found)."""
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            conn.execute("UPDATE campaign SET framework = ?, updated_at = ? WHERE campaign_id = ?",
                         (framework, self._now(), campaign_id))

    def finish_campaign(self, campaign_id: str, status: str, summary: dict) -> dict:
        """End the active campaign with ``status`` complete|returned|cancelled and its summary.

        The row is the archive: it leaves the active slot and keeps its tasks, plans and summary
        (FTL copied it to an ``archive`` table, §5.6). Returns the campaign dict.

        Raises:
            FtlError(schema_invalid): unknown status or a summary that is not a JSON object.
            FtlError(not_found): unknown campaign.
            FtlError(invalid_state): the campaign is already finished.
        """
        if status not in FINISHED_STATUSES:
            raise _violation("status", f"must be one of {', '.join(FINISHED_STATUSES)}, got {status!r}")
        if not isinstance(summary, dict):
            raise _violation("summary", "must be a JSON object")
        encoded = _dumps(summary, "summary")
        with self._session(write=True) as conn:
            row = self._campaign_row(conn, campaign_id)
            if row["status"] != "active":
                raise FtlError("invalid_state", {"trigger": f"finish:{status}", "state": row["status"]})
            now = self._now()
            conn.execute("UPDATE campaign SET status = ?, summary = ?, finished_at = ?, updated_at = ? "
                         "WHERE campaign_id = ?", (status, encoded, now, now, campaign_id))
            return self._campaign_dict(self._campaign_row(conn, campaign_id))
