"""The conformance fixture served by the real transports: ``python fixture_server.py --stdio`` or
``--http PORT``, running the real `ManglecpServer`, the clingo evaluator in worker processes and
``serve_stdio`` / ``create_app``, over the fixture catalog and rules of ``tests/manglecp``.

Options (test knobs, not protocol features):
    --locked: bearer auth with the tokens of `TOKENS` (and full_threshold 45, so the adaptive
        thresholds of this process differ from the open one's).
    --gate-dir DIR: start ``booting``; become ``ready`` when DIR/ready exists and ``draining``
        when DIR/drain exists (readiness, conformance item 45).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the fixture helpers

from manglecp.helpers import make_evaluator, make_server  # noqa: E402

from ftl.manglecp.access import BearerAuth, Principal  # noqa: E402
from ftl.manglecp.definitions import ServerLimits, SystemClock  # noqa: E402

TOKENS = {
    "good-token": Principal("alice"),
    "narrow-token": Principal("bob", permissions=frozenset({"levels"})),
    "robot-token": Principal("robot", trust_level="automated", auto_confirm_effects=frozenset({"payments"})),
}
SERVER_MAX_DERIVED = 120     # below the `heavy` intent's ~210 derivations, above every other intent's
MAX_FACTS_PER_REQUEST = 2000


def limits(locked: bool) -> ServerLimits:
    return ServerLimits(max_derived_facts=SERVER_MAX_DERIVED, max_facts_per_request=MAX_FACTS_PER_REQUEST,
                        progress_interval_s=0.05, rule_coverage=True,
                        full_threshold=45 if locked else 70)


def _follow_gate(server, gate_dir: Path) -> None:
    def watch() -> None:
        while not (gate_dir / "ready").exists():
            time.sleep(0.02)
        server.evaluator.warm()
        server.set_status("ready")
        while not (gate_dir / "drain").exists():
            time.sleep(0.02)
        server.set_status("draining")
    threading.Thread(target=watch, name="fixture-gate", daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stdio", action="store_true")
    parser.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--locked", action="store_true")
    parser.add_argument("--gate-dir", type=Path)
    options = parser.parse_args()
    from ftl.server.serve import _protocol_stdout, create_app, serve_stdio

    server = make_server(limits=limits(options.locked), evaluator=make_evaluator("process"),
                         auth=BearerAuth(TOKENS) if options.locked else None,
                         status="booting" if options.gate_dir else "ready", clock=SystemClock())
    if options.gate_dir:
        _follow_gate(server, options.gate_dir)
    if options.http:
        import uvicorn
        uvicorn.Server(uvicorn.Config(create_app(server), host="127.0.0.1", port=options.http,
                                      log_level="error", access_log=False)).run()
        return
    with _protocol_stdout() as proto:
        try:
            serve_stdio(server, sys.stdin.buffer, proto,
                        warm=None if options.gate_dir else server.evaluator.warm)
        finally:
            server.close()


if __name__ == "__main__":
    main()
