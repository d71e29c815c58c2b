"""A MangleCP stdio server that misbehaves on purpose, for the client-side robustness tests.

``python misbehaving_server.py MODE MANIFEST_FILE``: writes the manifest read from MANIFEST_FILE
(one JSON line), then answers every request by MODE (``cancel`` messages are ignored):

* ``junk``: an error whose id is a list, a 10 KB deeply nested line, a non-JSON line, then
  the real reply (an ``internal_error`` for the request's id);
* ``retry-text`` / ``retry-huge``: ``rate_limited`` with ``retry_after_ms`` "soon" / 1e12 while
  fewer than 3 requests came, then ``internal_error``;
* ``infinite-hint``: ``execution_failed`` with ``retry_after_ms`` 1e400 (reads as infinity);
* ``chatty``: ``progress`` every 20 ms for 1.5 s, then ``internal_error``.

Only the standard library loads here, so the process starts in tens of ms.
"""

from __future__ import annotations

import json
import sys
import time

VERSION = "2026-02-draft"


def send(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def error(request_id, code: str, message: str, recoverable: bool, hint: str | None = None) -> str:
    hint_text = f',"retry_after_ms":{hint}' if hint is not None else ""
    return ('{"type":"error","id":%s,"manglecp":"%s","payload":{"code":"%s","message":"%s",'
            '"recoverable":%s%s}}' % (json.dumps(request_id), VERSION, code, message,
                                      "true" if recoverable else "false", hint_text))


def main(mode: str, manifest_file: str) -> None:
    with open(manifest_file, encoding="utf-8") as handle:
        send(handle.read().strip())
    seen = 0
    for line in sys.stdin:
        request = json.loads(line)
        if request["type"] == "cancel":
            continue
        seen += 1
        request_id = request["id"]
        if mode == "junk":
            send(error([1], "internal_error", "unhashable id", False))
            send("[" * 5000 + "]" * 5000)
            send("not json at all")
            send(error(request_id, "internal_error", "the real reply", False))
        elif mode in ("retry-text", "retry-huge"):
            if seen < 3:
                send(error(request_id, "rate_limited", "slow down", True,
                           '"soon"' if mode == "retry-text" else "1e12"))
            else:
                send(error(request_id, "internal_error", "gave up", False))
        elif mode == "infinite-hint":
            send(error(request_id, "execution_failed", "failed", False, "1e400"))
        elif mode == "chatty":
            for _ in range(75):
                send(json.dumps({"type": "progress", "id": request_id, "manglecp": VERSION,
                                 "payload": {"status": "running"}}))
                time.sleep(0.02)
            send(error(request_id, "internal_error", "late", False))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
