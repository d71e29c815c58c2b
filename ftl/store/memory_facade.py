"""The store's door to cross-campaign memory: validate an entry, then hand it to
`ftl.memory.MemoryStore`, which holds the memory SQL (``ftl/memory/store.py``) and shares this
store's file, lock and clock.
"""

from __future__ import annotations

from ftl.store.codec import _violation

MEMORY_TYPES = ("failure", "pattern")


class MemoryMixin:
    """`ftl.store.Store`'s memory entries, through its `ftl.memory.MemoryStore`."""

    def memory_store(self):
        """This store's `ftl.memory.MemoryStore` (failures and patterns across campaigns; its SQL
        lives in ``ftl/memory/store.py``)."""
        if getattr(self, "_memory", None) is None:
            from ftl.memory import MemoryStore

            self._memory = MemoryStore(self)
        return self._memory

    def add_memory(self, entry: dict) -> dict:
        """Record a failure or success pattern the runner extracted (no quality gate).

        ``entry``: ``{name, type: failure|pattern, trigger, fix (failure) | insight (pattern),
        cost | saved?, source: [..], campaign_id, ...}``; extra keys are kept. An entry with the
        same ``(name, type)`` (or, for failures, a trigger more than 85 % similar) is not
        duplicated: its ``occurrences`` goes up by one and the sources are united. Returns the
        stored entry (`ftl.memory.MemoryStore.get` shape).

        Raises: FtlError(schema_invalid) naming the missing or malformed key.
        """
        if not isinstance(entry, dict):
            raise _violation("memory", "must be a JSON object")
        name, kind, trigger = entry.get("name"), entry.get("type"), entry.get("trigger")
        if not isinstance(name, str) or not name.strip():
            raise _violation("memory.name", "must be a non-empty string")
        if kind not in MEMORY_TYPES:
            raise _violation("memory.type", f"must be one of {', '.join(MEMORY_TYPES)}, got {kind!r}")
        if not isinstance(trigger, str) or not trigger.strip():
            raise _violation("memory.trigger", "must be a non-empty string")
        text_key = "fix" if kind == "failure" else "insight"
        if not isinstance(entry.get(text_key), str):
            raise _violation(f"memory.{text_key}", f"a {kind} entry needs a {text_key} string")
        return self.memory_store().record(entry)

    def memory(self, type: str | None = None, limit: int = 50, objective: str | None = None) -> list[dict]:
        """Memory entries, most important first, at most ``limit``; with ``objective``, the
        entries ranked for it (`ftl.memory.MemoryStore.context`, which also counts them as read).

        Raises: FtlError(schema_invalid) for an unknown type or a negative limit.
        """
        if type is not None and type not in MEMORY_TYPES:
            raise _violation("type", f"must be one of {', '.join(MEMORY_TYPES)}, got {type!r}")
        if limit < 0:
            raise _violation("limit", "must be >= 0")
        memory = self.memory_store()
        if objective:
            found = memory.context(objective=objective, max_failures=limit if type != "pattern" else 0,
                                   max_patterns=limit if type != "failure" else 0)
            return (found["failures"] + found["patterns"])[:limit]
        return memory.entries(type, limit)
