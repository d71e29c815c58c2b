"""Executors: where task work runs. Today the local one (processes on this machine: parent-death
signals and the ledger of running process groups, `ftl.executors.processes`)."""
