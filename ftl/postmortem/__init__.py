"""Postmortem: read an event log back, check its invariants, and render it.

Rooms: ``spool`` (an on-disk table of a log's records, so a large log replays in bounded
memory), ``read`` (a log's lines, tolerantly), ``check`` (the invariant checker), ``timeline``
(the records, `Replay` and its JSON view), ``replay`` (the entry point and front door: the
names callers use), ``text`` and ``html`` (the renderings), ``diff`` (two runs' decisions
compared) and ``cli`` (``ftl replay`` and ``ftl diagram``).
Data flows one way: event log → read → check → timeline (spooled) → text/JSON/HTML. Nothing
here writes to the store or the log.
"""
