"""Telemetry: what an operator watches while ftl runs, fed one way from what ftl does.

``logs`` (the structured JSON server-side log), ``metrics`` (Prometheus counters from the
event log) and ``progress`` (the live task table and plain progress lines). They only read:
a broken view or counter can never change what a campaign does.
"""
