"""Explorer results (each explorer's raw result) and explorations (their aggregate), per
campaign (FTL's explorer_result and exploration rows, reference §5.5).
"""

from __future__ import annotations

from ftl.store.codec import _dumps, _loads, _violation


class ExplorationsMixin:
    """`ftl.store.Store`'s explorer results and explorations. Uses the store's ``_session`` and
    ``_now`` and `CampaignsMixin._campaign_row`."""

    def record_explorer_result(self, campaign_id: str, mode: str, result: dict) -> None:
        """Keep one explorer's raw result (FTL explorer_result row, §5.5); duplicates are kept and
        resolved by aggregation. Raises: FtlError(schema_invalid) for an unknown mode or non-JSON
        result; FtlError(not_found)."""
        try:
            from ftl.explore_rules import ExplorerMode
            mode = ExplorerMode(mode).value
        except ValueError:
            raise _violation("mode", f"must be one of {', '.join(m.value for m in ExplorerMode)}, "
                                     f"got {mode!r}") from None
        if not isinstance(result, dict):
            raise _violation("result", "must be a JSON object")
        encoded = _dumps(result, "result")
        status = result.get("status")
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            conn.execute("INSERT INTO explorer_result (campaign_id, mode, status, result, created_at) "
                         "VALUES (?, ?, ?, ?, ?)",
                         (campaign_id, mode, status if isinstance(status, str) else None, encoded, self._now()))

    def explorer_results(self, campaign_id: str) -> list[dict]:
        """The campaign's explorer results, oldest first: ``{mode, status, result, created_at}``."""
        with self._session() as conn:
            self._require_campaign(conn, campaign_id)
            rows = conn.execute("SELECT mode, status, result, created_at FROM explorer_result "
                                "WHERE campaign_id = ? ORDER BY id", (campaign_id,)).fetchall()
        return [{"mode": r[0], "status": r[1], "result": _loads(r[2]), "created_at": r[3]} for r in rows]

    def save_exploration(self, campaign_id: str, exploration: dict) -> int:
        """Save an aggregated exploration (FTL exploration row: ``{_meta, structure, pattern,
        memory, delta}``); return its row id (FTL ``write``'s id). Raises:
        FtlError(schema_invalid) for non-JSON; FtlError(not_found)."""
        if not isinstance(exploration, dict):
            raise _violation("exploration", "must be a JSON object")
        encoded = _dumps(exploration, "exploration")
        with self._session(write=True) as conn:
            self._require_campaign(conn, campaign_id)
            return conn.execute("INSERT INTO exploration (campaign_id, exploration, created_at) VALUES (?, ?, ?)",
                                (campaign_id, encoded, self._now())).lastrowid

    def clear_explorer_results(self, campaign_id: str) -> int:
        """Delete the campaign's explorer results (FTL clear-session); return how many."""
        with self._session(write=True) as conn:
            return conn.execute("DELETE FROM explorer_result WHERE campaign_id = ?", (campaign_id,)).rowcount

    def clear_explorations(self) -> int:
        """Delete every aggregated exploration (FTL exploration.py clear); return how many."""
        with self._session(write=True) as conn:
            return conn.execute("DELETE FROM exploration").rowcount

    def exploration(self, campaign_id: str | None = None) -> dict | None:
        """The newest exploration of ``campaign_id`` (or of any campaign when None), or None."""
        with self._session() as conn:
            if campaign_id is None:
                row = conn.execute("SELECT exploration FROM exploration ORDER BY id DESC LIMIT 1").fetchone()
            else:
                row = conn.execute("SELECT exploration FROM exploration WHERE campaign_id = ? "
                                   "ORDER BY id DESC LIMIT 1", (campaign_id,)).fetchone()
        return None if row is None else _loads(row[0])
