"""`ftl.ids.unique_hex`: fixed-width hex ids, never repeated in a process nor shared with a
forked child."""

from __future__ import annotations

import os
import re
import threading

import pytest

from ftl.ids import unique_hex


def test_ids_have_the_width_asked_for_and_do_not_repeat() -> None:
    for width in (2, 6, 12, 32, 128):
        assert re.fullmatch(f"[0-9a-f]{{{width}}}", unique_hex(width))
    ids = [unique_hex(12) for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for width in (0, 3, 130, -2):
        with pytest.raises(ValueError):
            unique_hex(width)


def test_threads_get_distinct_ids() -> None:
    found: list[list[str]] = [[] for _ in range(4)]
    threads = [threading.Thread(target=lambda out: out.extend(unique_hex(16) for _ in range(5000)),
                                args=(found[i],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for ids in found for i in ids]
    assert len(set(every)) == len(every) == 20_000


def test_a_forked_child_hands_out_ids_of_its_own() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the same number of ids as the parent will take
        os.close(read)
        os.write(write, " ".join(unique_hex(16) for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    parent = {unique_hex(16) for _ in range(100)}
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    assert len(child) == 100 and not parent & child
