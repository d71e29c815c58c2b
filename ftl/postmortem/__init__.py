"""Postmortem: read an event log back, check its invariants, and render it.

Rooms: ``spool`` (an on-disk table of a log's tasks, so a large log replays in bounded
memory), ``replay`` (the timeline, the invariants, the text and JSON views, decision diffs),
``html`` (the self-contained HTML page) and ``cli`` (``ftl replay`` and ``ftl diagram``).
Data flows one way: event log → spool → replay → text/JSON/HTML. Nothing here writes to
the store or the log.
"""
