"""Random-looking unique ids without a system call each.

`uuid.uuid4` reads the kernel's random source (a ``getrandom`` system call) for every id, and
a task asked for six of them on its hot path (two MangleCP request ids, two correlation ids,
two recovery operations; issue 11 item 3). Here the kernel is asked once per process, for a
16-byte key, and each id is the BLAKE2b hash of that key and a counter: as unpredictable to a
reader of the ids as ``uuid4`` text of the same width, and never repeated within a process.
A forked child draws a key of its own, so parent and child never hand out the same id.

Where an id is a secret (a confirmation token, an approval id), use `secrets` instead.
"""

from __future__ import annotations

import hashlib
import itertools
import os

__all__ = ["unique_hex"]

_key = b""
_counter = itertools.count()


def _reseed() -> None:
    global _key, _counter
    _key, _counter = os.urandom(16), itertools.count()


_reseed()
os.register_at_fork(after_in_child=_reseed)


def unique_hex(width: int = 12) -> str:
    """A new id of ``width`` lowercase hex digits (an even number from 2 to 128).

    Thread-safe (``next`` on a counter is atomic under the GIL). Raises ValueError for a
    width outside that range."""
    if width % 2 or not 2 <= width <= 128:
        raise ValueError(f"width must be an even number from 2 to 128, got {width}")
    return hashlib.blake2b(next(_counter).to_bytes(8, "little"), key=_key,
                           digest_size=width // 2).hexdigest()
