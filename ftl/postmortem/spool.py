"""On-disk record tables for a replay's story, so a multi-GB log replays in flat memory.

A postmortem keeps every task attempt, failure, retry and state stay of a run; on a large log
that is hundreds of thousands of records. `Spool` keeps them in a private temporary SQLite
database (``sqlite3.connect("")``: on disk, deleted when closed) with a small page cache, and
hands them back in order. Records go in as tuples of plain values (`marshal`: this process
writes and reads them, nothing else ever does).

- `Records`: an append-only sequence. A record is added once it is settled (no later event
  can change it) under a key reserved when it began, so iteration follows creation order
  (an attempt by its start, a failure by its ``TOOL_FAILURE``) whatever the settling order.
- `TaskTable`: the per-task final word, which events keep changing (a block, a propagation, a
  resume). A write-back cache of at most ``capacity`` records in memory over a keyed table;
  callers look records up by key for every event and never hold one across events, so an
  evicted record is never changed behind the table's back.

Memory is the page cache (`CACHE_KIB`), the pending batch, the task cache (`TASK_CACHE`) and
a fixed 4 MiB Bloom filter: independent of the number of records.
"""

from __future__ import annotations

import marshal
import sqlite3
from heapq import heappop, heappush
from itertools import groupby, islice
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")

BATCH = 64  # records per blob: small, so settled records are freed while still in the CPU cache
ROWS = 2048  # rows per executemany
EVICT = 256  # task records written out at a time once the cache is full
CACHE_KIB = 4096  # SQLite page cache per spool
TASK_CACHE = 16384  # task records kept in memory; past it the oldest `EVICT` are written out
_NO_DIGIT_KEY = 1 << 62  # sort key of a task seq that is not a (small) number: after all numbers
_FILTER_BITS = 1 << 25  # 4 MiB: about 1.4% false positives at two million written tasks
_FILTER_MASK = _FILTER_BITS - 1

_dumps, _loads = marshal.dumps, marshal.loads


class Spool:
    """One private temporary SQLite database holding a replay's tables.

    Raises:
        sqlite3.Error: the temporary directory (``$TMPDIR``, ``$SQLITE_TMPDIR``) is not writable
            or is full.
    """

    def __init__(self) -> None:
        self.db = sqlite3.connect("", isolation_level=None, check_same_thread=False)
        self.db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        self._names: set[str] = set()

    def table(self, name: str) -> str:
        if name in self._names or not name.isidentifier():
            raise ValueError(f"table {name!r} exists or is not a name")
        self._names.add(name)
        return name

    def write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        db = self.db
        db.execute("BEGIN")
        db.executemany(sql, rows)
        db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


class Records(Generic[T]):
    """An append-only, ordered, re-iterable sequence of records kept in a `Spool`.

    ``encode`` turns a record into a tuple (or dict) of plain values, ``decode`` back. Records
    are written `BATCH` at a time as one blob (a row per record costs SQLite about ten times
    more); iteration merges the batches by key, holding about one batch. Supports ``len``,
    iteration in key order, indexing (``[0]``, ``[-1]``: a scan) and ``==`` with a list, so it
    reads like the list it replaces.
    """

    def __init__(self, spool: Spool, name: str, encode: Callable[[T], Any] = lambda r: r,
                 decode: Callable[[Any], T] = lambda v: v) -> None:
        self._spool = spool
        self._name = spool.table(name)
        # A batch's first key is its smallest, and no two batches share a record: the rowid.
        spool.db.execute(f"CREATE TABLE {name} (first INTEGER PRIMARY KEY, v BLOB NOT NULL)")
        self._insert = f"INSERT INTO {name} VALUES (?, ?)"
        self._encode, self._decode = encode, decode
        self._pending: list[tuple[int, Any]] = []
        self._next = 0
        self._count = 0

    def reserve(self) -> int:
        """A key for a record that begins now and is added (`add`) when it settles."""
        key = self._next
        self._next += 1
        return key

    def add(self, record: T, key: int | None = None) -> None:
        """Add a settled record under ``key`` (from `reserve`; default: the next key)."""
        if key is None:
            key = self._next
            self._next += 1
        pending = self._pending
        pending.append((key, self._encode(record)))
        self._count += 1
        if len(pending) >= BATCH:
            self.flush()

    append = add

    def flush(self) -> None:
        pending = self._pending
        if pending:
            pending.sort(key=_first)
            self._spool.write(self._insert, [(pending[0][0], _dumps(pending))])
            self._pending = []

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[T]:
        self.flush()
        decode = self._decode
        heap: list[tuple[int, Any]] = []
        rows = self._spool.db.execute(f"SELECT first, v FROM {self._name} ORDER BY first")
        for first, blob in rows:
            # Every later batch starts at or after `first`: what the heap holds below it is next.
            while heap and heap[0][0] < first:
                yield decode(heappop(heap)[1])
            batch = _loads(blob)
            if heap:
                for item in batch:
                    heappush(heap, item)
            else:
                heap = batch  # sorted at flush: already a heap
        while heap:
            yield decode(heappop(heap)[1])

    def __getitem__(self, index: int) -> T:
        if not isinstance(index, int):
            raise TypeError("records are indexed by position (an int)")
        position = index + self._count if index < 0 else index
        if not 0 <= position < self._count:
            raise IndexError(index)
        return next(islice(self, position, None))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, Records)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Records {self._name}: {self._count}>"


def _first(item: tuple[int, Any]) -> int:
    return item[0]


def task_sort_key(seq: object) -> int:
    """The numeric order of a task seq (``"002"`` before ``"010"``); other seqs sort after."""
    if type(seq) is not str:
        seq = str(seq)
    # isdecimal+isascii: "²" is a digit to isdigit() but not a number to int().
    return int(seq) if seq.isascii() and seq.isdecimal() and len(seq) < 18 else _NO_DIGIT_KEY


def _text(seq: str) -> bytes:
    """A seq as stored: UTF-8 bytes (surrogates a log may hold passed through), which sort
    like the str."""
    return seq.encode("utf-8", "surrogatepass")


class TaskTable(Generic[T]):
    """The per-task records of a replay: a write-back cache over a `Spool` table, by task seq.

    ``encode``/``decode`` as for `Records`; ``blocked_by(record)`` is None for a task that is
    not blocked, else the seqs of the roots that made it unreachable (``[]``: it is a root),
    for `blocked` and `cascade`. ``capacity`` (default `TASK_CACHE`) bounds the records in
    memory: past it the oldest are written out (`evict`, called by the owner between events
    only, so no caller holds an evicted record).
    """

    def __init__(self, spool: Spool, name: str, encode: Callable[[T], Any], decode: Callable[[Any], T],
                 blocked_by: Callable[[T], list[str] | None], capacity: int | None = None) -> None:
        self._spool = spool
        self._name = spool.table(name)
        # Keyed in task order, so listing in order is a scan, not a sort.
        spool.db.execute(f"CREATE TABLE {name} (k INTEGER NOT NULL, seq BLOB NOT NULL, "
                         "blocked INTEGER NOT NULL, v BLOB NOT NULL, PRIMARY KEY (k, seq)) WITHOUT ROWID")
        self._upsert = f"INSERT OR REPLACE INTO {name} VALUES (?, ?, ?, ?)"
        self._select = f"SELECT v FROM {name} WHERE k = ? AND seq = ?"
        self._encode, self._decode, self._blocked_by = encode, decode, blocked_by
        self.capacity = max(2, TASK_CACHE if capacity is None else capacity)
        self.cache: dict[str, T] = {}
        # A fixed-size Bloom filter of the seqs written out: most misses are new tasks, and
        # the filter answers them without a query (a false positive only costs one).
        self._written = bytearray(_FILTER_BITS >> 3)
        self._count = 0

    def _maybe_written(self, seq: str) -> bool:
        h = hash(seq)
        a, b = h & _FILTER_MASK, (h >> 32) & _FILTER_MASK
        bits = self._written
        return bool(bits[a >> 3] & (1 << (a & 7))) and bool(bits[b >> 3] & (1 << (b & 7)))

    def get(self, seq: str, default: T | None = None) -> T | None:
        record = self.cache.get(seq)
        if record is None and self._maybe_written(seq):
            row = self._spool.db.execute(self._select, (task_sort_key(seq), _text(seq))).fetchone()
            if row is not None:
                record = self.cache[seq] = self._decode(_loads(row[0]))
        return default if record is None else record

    def peek(self, seq: str) -> T | None:
        """`get` for readers: a record not in the cache is decoded without entering it, so
        reading every task (a report) does not grow the cache. Do not change what it returns."""
        record = self.cache.get(seq)
        if record is None and self._maybe_written(seq):
            row = self._spool.db.execute(self._select, (task_sort_key(seq), _text(seq))).fetchone()
            if row is not None:
                record = self._decode(_loads(row[0]))
        return record

    def add(self, seq: str, record: T) -> T:
        """Insert a new task's record (the caller checked with `get` that it is new)."""
        self.cache[seq] = record
        self._count += 1
        return record

    def __getitem__(self, seq: str) -> T:
        record = self.get(seq)
        if record is None:
            raise KeyError(seq)
        return record

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, str) and self.get(seq) is not None

    def __len__(self) -> int:
        return self._count

    def evict(self) -> None:
        """Write out the oldest records when the cache is over capacity."""
        cache = self.cache
        if len(cache) <= self.capacity:
            return
        out = list(islice(cache, len(cache) - self.capacity + EVICT))
        self._write([(seq, cache.pop(seq)) for seq in out])

    def flush(self) -> None:
        """Write every cached record (they stay cached)."""
        self._write(list(self.cache.items()))

    def _write(self, items: list[tuple[str, T]]) -> None:
        if not items:
            return
        encode, bits = self._encode, self._written
        blocked_by = self._blocked_by
        rows = [(task_sort_key(seq), _text(seq), 0 if blocked_by(record) is None else 1, _dumps(encode(record)))
                for seq, record in items]
        for start in range(0, len(rows), ROWS):
            self._spool.write(self._upsert, rows[start:start + ROWS])
        for seq, _ in items:
            h = hash(seq)
            for i in (h & _FILTER_MASK, (h >> 32) & _FILTER_MASK):
                bits[i >> 3] |= 1 << (i & 7)

    def values(self) -> Iterator[T]:
        """Every record in task order (numeric seqs first)."""
        yield from self._query("")

    def blocked(self) -> Iterator[T]:
        """The blocked tasks' records, in task order."""
        yield from self._query("WHERE blocked = 1")

    def cascade(self) -> Iterator[tuple[str, list[str]]]:
        """The cascade tree: ``(root, [blocked seq, ...])`` for every root (a blocked task that
        names no root, or a seq some blocked task names), roots and their lists in task order.
        The (root, task) pairs of the blocked tasks go through a temporary table to be sorted;
        memory holds one root's list at a time."""
        self.flush()
        db, decode, blocked_by = self._spool.db, self._decode, self._blocked_by
        db.execute("DROP TABLE IF EXISTS temp.cascade_pairs")
        db.execute("CREATE TEMP TABLE cascade_pairs (rk INTEGER, root BLOB, k INTEGER, seq BLOB)")
        pairs: list[tuple[int, bytes, int | None, bytes | None]] = []
        insert = "INSERT INTO temp.cascade_pairs VALUES (?, ?, ?, ?)"
        for k, seq, value in db.execute(f"SELECT k, seq, v FROM {self._name} WHERE blocked = 1"):
            roots = blocked_by(decode(_loads(value))) or ()
            if not roots:
                pairs.append((k, seq, None, None))
            pairs.extend((task_sort_key(root), _text(root), k, seq) for root in roots)
            if len(pairs) >= ROWS:
                self._spool.write(insert, pairs)
                pairs = []
        if pairs:
            self._spool.write(insert, pairs)
        rows = db.execute("SELECT root, seq FROM temp.cascade_pairs ORDER BY rk, root, k, seq")
        for root, group in groupby(rows, key=_first):
            yield (root.decode("utf-8", "surrogatepass"),
                   [seq.decode("utf-8", "surrogatepass") for _, seq in group if seq is not None])

    def _query(self, where: str) -> Iterator[T]:
        self.flush()
        decode = self._decode
        for (value,) in self._spool.db.execute(f"SELECT v FROM {self._name} {where} ORDER BY k, seq"):
            yield decode(_loads(value))

    def __iter__(self) -> Iterator[str]:
        for record in self.values():
            yield getattr(record, "seq")

    def __repr__(self) -> str:
        return f"<TaskTable {self._name}: {self._count}>"
