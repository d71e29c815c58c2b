"""The evaluation worker process: ``python -m ftl.server.evaluation.child READ_FD WRITE_FD``.

Started by `ftl.server.evaluation.workers.ClingoEvaluator` (process isolation). It imports the
program only (clingo), not the protocol: a worker starts in the background of every server
boot.
"""

from __future__ import annotations

import sys

from ftl.server.evaluation.program import Program, run_safely


def _worker_main(read_fd: int, write_fd: int) -> None:
    """Worker loop (``python -m ftl.server.evaluation.child READ_FD WRITE_FD``): the first message holds
    the rules, the server facts and the memory cap; then one answer per request until EOF."""
    from multiprocessing.connection import Connection
    conn_in, conn_out = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        setup = conn_in.recv()
    except (EOFError, OSError):
        return
    if setup.get("memory_limit_bytes"):
        try:
            import resource
            limit = setup["memory_limit_bytes"]
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    try:
        program = Program(setup["rule_texts"], setup["server_facts"], setup["hidden_predicates"])
    except Exception as exc:  # reported to the parent, which logs it
        conn_out.send({"fatal": f"{type(exc).__name__}: {exc}"})
        return
    conn_out.send({"ready": True})
    while True:
        try:
            request = conn_in.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        conn_out.send(run_safely(program, request))


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]), int(sys.argv[2]))
