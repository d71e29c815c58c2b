"""Pure graph algorithms over a plan's task DAG: cycles, ready set, unreachable set, critical path.

No I/O and no clock: every function takes the graph and the task statuses as plain mappings and
returns plain data, so the store, the scheduler and the CASCADE state share one definition.

Conventions (all functions):

* A graph is ``Mapping[str, Sequence[str]]``: task seq -> the seqs it depends on. An edge
  ``a -> b`` in a path means "a depends on b".
* Seqs are compared as integers (``"007"`` sorts before ``"010"``); every list this module returns
  is ordered by ``int(seq)``. Validated plans use canonical three-digit seqs
  (`ftl.models.normalize_seq`); this module neither pads nor strips them, so the seqs it returns
  are spelled exactly as in the input (FTL cascade-status mixed padded and unpadded seqs, defect
  §8.2-10).
* Statuses are ``Mapping[str, str]`` with values pending, running, complete, blocked (the
  values of `ftl.models.TaskStatus`; its members are accepted too). A task with no entry counts
  as pending; any other value raises ``ValueError``. The module compares plain strings and does
  not import the models, so light commands (``ftl campaign status``) never load pydantic.

Source of the rules: FTL campaign.py (``shared/reference/ftl-behaviour.md`` §6), with the defects
of §8.2 items 10-12 fixed: the unreachable set is transitive, cascade-status states say what they
mean, and every blocked task names the root blocks that caused it.
"""

from __future__ import annotations

import graphlib
import heapq
from collections import deque
from itertools import chain
from typing import Mapping, Sequence

Graph = Mapping[str, Sequence[str]]
Statuses = Mapping[str, object]  # seq -> status text or `ftl.models.TaskStatus` member

PENDING, RUNNING, COMPLETE, BLOCKED = "pending", "running", "complete", "blocked"
#: The task statuses of the store (`ftl.models.TaskStatus` values; a test keeps them equal).
STATUSES: tuple[str, ...] = (PENDING, RUNNING, COMPLETE, BLOCKED)
_KNOWN = frozenset(STATUSES)

__all__ = [
    "ancestors", "cascade_status", "critical_path", "critical_path_impact", "dangling",
    "descendants", "find_cycle", "format_cycle", "propagate_blocks", "ready_set",
    "seq_key", "topological_order", "unreachable",
]


def seq_key(seq: str) -> tuple[int, int, str]:
    """Sort key that orders seqs as integers; non-numeric seqs (never in a valid plan) sort last."""
    text = str(seq).strip()
    if text.isascii() and text.isdigit():
        return (0, int(text), text)
    return (1, 0, text)


def _sorted(seqs) -> list[str]:
    return sorted(seqs, key=seq_key)


def _status(status: Statuses, seq: str) -> str:
    """``seq``'s status as text; an enum member gives its value (a str enum hashes by name)."""
    value = status.get(seq, PENDING)
    text = getattr(value, "value", value)
    if text not in _KNOWN:
        raise ValueError(f"{text!r} is not a valid task status ({', '.join(STATUSES)})")
    return text


def _internal_deps(deps: Graph, seq: str) -> list[str]:
    """``seq``'s dependencies that are tasks of the graph, ordered by int seq."""
    return _sorted({d for d in deps.get(seq, ()) if d in deps})


def _dependents(deps: Graph) -> dict[str, list[str]]:
    """Reverse graph: seq -> the graph's tasks that depend on it directly, ordered by int seq."""
    reverse: dict[str, set[str]] = {}
    for seq, parents in deps.items():
        for parent in parents:
            reverse.setdefault(parent, set()).add(seq)
    return {seq: _sorted(children) for seq, children in reverse.items()}


def _reach(edges: Mapping[str, Sequence[str]], sources) -> set[str]:
    """Nodes reachable from ``sources`` by one or more edges (a source is included only if it
    is reachable from a source, i.e. on a cycle)."""
    seen: set[str] = set()
    queue = deque(node for source in sources for node in edges.get(source, ()))
    while queue:
        node = queue.popleft()
        if node not in seen:
            seen.add(node)
            queue.extend(edges.get(node, ()))
    return seen


# --------------------------------------------------------------------------- structure checks

def find_cycle(deps: Graph) -> list[str] | None:
    """Return one dependency cycle as a closed path, or None when the graph is a DAG.

    The path starts and ends with the same seq and each element depends on the next, e.g.
    ``["001", "003", "001"]`` (001 depends on 003, which depends on 001); a self-dependency is
    ``["001", "001"]``. Deterministic: depth-first from the lowest seq, visiting dependencies in
    int-seq order, so the same graph always gives the same cycle. Dependencies on seqs outside
    the graph are ignored here (see `dangling`). Rule source: FTL cycle detection (§6.3); the DFS
    is iterative, so deep plans cannot hit Python's recursion limit.
    """
    if _numbered_downwards(deps):
        return None
    done: set[str] = set()
    for start in _sorted(deps):
        if start in done:
            continue
        path: list[str] = [start]
        on_path = {start: 0}
        stack = [iter(_internal_deps(deps, start))]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                node = path.pop()
                del on_path[node]
                done.add(node)
                continue
            if child in on_path:
                return path[on_path[child]:] + [child]
            if child in done:
                continue
            on_path[child] = len(path)
            path.append(child)
            stack.append(iter(_internal_deps(deps, child)))
    return None


def _numbered_downwards(deps: Graph) -> bool:
    """True when every dependency inside the graph has a lower number than its task: the numbers
    fall along every path, so no path returns to its start (planners number tasks in order, so
    most plans pass this linear test and skip the depth-first search)."""
    try:
        return all(int(dep) < number for seq, parents in deps.items() for number in (int(seq),)
                   for dep in parents if dep in deps)
    except (TypeError, ValueError):  # a seq that is not a number: the search decides
        return False


def format_cycle(path: Sequence[str]) -> str:
    """Render a cycle path for messages: ``["001", "003", "001"]`` -> ``"001 -> 003 -> 001"``."""
    return " -> ".join(path)


def dangling(deps: Graph) -> list[tuple[str, str]]:
    """Every ``(task seq, missing dependency seq)`` whose dependency is not a task of the graph.

    Ordered by task then dependency, both as integers (FTL dangling-deps check, §6.4).
    """
    if deps.keys() >= set(chain.from_iterable(deps.values())):  # none: one C-level pass
        return []
    pairs = {(seq, dep) for seq, parents in deps.items() for dep in parents if dep not in deps}
    return sorted(pairs, key=lambda pair: (seq_key(pair[0]), seq_key(pair[1])))


def topological_order(deps: Graph) -> list[str]:
    """All tasks, every task after its dependencies; among tasks free at once, lowest seq first.

    This is the unique lexicographically smallest topological order (by int seq), computed with
    `graphlib.TopologicalSorter` releasing one task at a time. Dependencies outside the graph are
    ignored.

    Raises:
        graphlib.CycleError: the graph has a cycle; ``args[1]`` is the path from `find_cycle`.
    """
    sorter: graphlib.TopologicalSorter[str] = graphlib.TopologicalSorter()
    for seq in deps:
        sorter.add(seq, *_internal_deps(deps, seq))
    try:
        sorter.prepare()
    except graphlib.CycleError:
        path = find_cycle(deps) or []
        raise graphlib.CycleError(f"dependency cycle: {format_cycle(path)}", path) from None
    order: list[str] = []
    heap: list[tuple[tuple[int, int, str], str]] = []
    while sorter.is_active():
        for seq in sorter.get_ready():
            heapq.heappush(heap, (seq_key(seq), seq))
        _, seq = heapq.heappop(heap)
        order.append(seq)
        sorter.done(seq)
    return order


# --------------------------------------------------------------------------- reachability

def ancestors(deps: Graph, seq: str) -> set[str]:
    """Every task ``seq`` depends on, directly or transitively (only tasks of the graph).

    ``seq`` itself is included only if it lies on a cycle. A seq absent from the graph has none.
    """
    if seq not in deps:
        return set()
    return _reach({node: _internal_deps(deps, node) for node in deps}, [seq])


def descendants(deps: Graph, seq: str) -> set[str]:
    """Every task of the graph that depends on ``seq``, directly or transitively.

    ``seq`` itself is included only if it lies on a cycle. ``seq`` need not be a task of the graph
    (the dependents of a dangling seq are found too).
    """
    return _reach(_dependents(deps), [seq])


def ready_set(deps: Graph, status: Statuses) -> list[str]:
    """Pending tasks whose every dependency is complete, ordered by int seq (FTL ready-tasks §6.5).

    A dependency's status is read from ``status`` even when it is not a task of the graph, so a
    caller may pass a sub-graph; a dependency with no status counts as pending (never ready).

    Raises:
        ValueError: a status value is not one of `STATUSES`.
    """
    ready = _ready_unchecked(deps, status)
    if ready is None:  # some status is not a valid one: raise for the first, in seq order
        return [seq for seq in _sorted(deps)
                if _status(status, seq) == PENDING
                and all(_status(status, dep) == COMPLETE for dep in deps[seq])]
    return _sorted(ready)


def _ready_unchecked(deps: Graph, status: Statuses) -> list[str] | None:
    """`ready_set` in graph order, or None when it meets a status that `_status` would refuse.

    One pass without a call per task (a 10,000-task campaign: 3 ms, not 12): the tasks are not
    sorted first, only the ready ones after, and a status is resolved inline.
    """
    get = status.get
    ready = []
    try:
        for seq, parents in deps.items():
            value = get(seq, PENDING)
            text = value if type(value) is str else getattr(value, "value", value)
            if text != PENDING:
                if text not in _KNOWN:
                    return None
                continue
            for dep in parents:
                value = get(dep, PENDING)
                text = value if type(value) is str else getattr(value, "value", value)
                if text != COMPLETE:
                    if text not in _KNOWN:
                        return None
                    break
            else:
                ready.append(seq)
    except TypeError:  # an unhashable status value
        return None
    return ready


def unreachable(deps: Graph, status: Statuses) -> dict[str, list[str]]:
    """Every pending task that can never run because a task upstream of it is blocked.

    Transitive, unlike FTL cascade-status (§6.5, defect §8.2-10), which saw only the direct
    children of a blocked task: a grandchild whose parent is still pending is included here.

    Returns:
        ``{seq: blocked_by}`` ordered by int seq, where ``blocked_by`` lists the task's *root*
        blocks, ordered by int seq. Definition: a root of task T is a blocked ancestor B of T such
        that no ancestor of B is blocked, i.e. where the block originated rather than where it was
        propagated to. Every unreachable task has at least one root in a DAG, and the roots do not
        change when `propagate_blocks` marks the downstream tasks blocked. (If the blocked
        ancestors form a cycle, which a validated plan cannot, all blocked ancestors are named.)

    Raises:
        ValueError: a status value is not one of `STATUSES`.
    """
    blocked = {seq for seq in deps if _status(status, seq) == BLOCKED}
    if not blocked:
        return {}
    reverse = _dependents(deps)
    downstream = _reach(reverse, blocked)  # every task with a blocked ancestor
    roots = blocked - downstream
    causes: dict[str, set[str]] = {}
    for root in roots:  # one traversal per root block, not one per task
        for seq in _reach(reverse, [root]):
            causes.setdefault(seq, set()).add(root)
    result: dict[str, list[str]] = {}
    for seq in _sorted(downstream):
        if seq in deps and _status(status, seq) == PENDING:
            result[seq] = _sorted(causes.get(seq) or ancestors(deps, seq) & blocked)
    return result


def propagate_blocks(deps: Graph, status: Statuses) -> list[tuple[str, list[str]]]:
    """The tasks to mark blocked, with their root blocks: every task `unreachable` returns.

    Pure: the caller writes the statuses (and ``blocked_by``). Unlike FTL propagate-blocks (§6.6),
    this does not wait until no other branch is ready, and needs no fixpoint loop, because the
    unreachable set is already transitive. Applying the result and calling again returns [].

    Returns:
        ``[(seq, blocked_by roots)]`` ordered by int seq.
    """
    return list(unreachable(deps, status).items())


def cascade_status(deps: Graph, status: Statuses) -> dict:
    """Summarise a campaign's progress (FTL cascade-status §6.5, with the defects of §8.2-10 fixed).

    Returns:
        ``{"state", "complete", "blocked", "pending", "running", "ready", "unreachable"}`` where
        the counts are numbers of tasks and ``unreachable`` is
        ``[{"seq": seq, "blocked_by": [root seqs]}]`` from `unreachable`, ordered by int seq and
        reported in every state (a re-plan may be worth it while other branches still run).

        ``state`` is decided by the first matching row:

        =============  ==========================================================================
        state          condition
        =============  ==========================================================================
        complete       every task is complete (also for an empty plan)
        in_progress    at least one task is ready or running
        all_blocked    no task is pending or running, and at least one is blocked
        stuck          pending tasks exist but none can ever run: none is ready and nothing is
                       running that could complete a dependency (unreachable names the causes;
                       a dependency outside the graph can also leave a task stuck)
        =============  ==========================================================================

        FTL called an all-blocked campaign "complete" and a campaign waiting on running parents
        "all_blocked"; here those are "all_blocked" and "in_progress". The caller adds state
        "none" when there is no campaign.

    Raises:
        ValueError: a status value is not one of `STATUSES`.
    """
    counts = dict.fromkeys(STATUSES, 0)
    for seq in deps:
        counts[_status(status, seq)] += 1
    ready = ready_set(deps, status)
    if counts[COMPLETE] == len(deps):
        state = "complete"
    elif ready or counts[RUNNING]:
        state = "in_progress"
    elif not counts[PENDING]:
        state = "all_blocked"
    else:
        state = "stuck"
    return {
        "state": state,
        "complete": counts[COMPLETE],
        "blocked": counts[BLOCKED],
        "pending": counts[PENDING],
        "running": counts[RUNNING],
        "ready": len(ready),
        "unreachable": [{"seq": seq, "blocked_by": roots}
                        for seq, roots in unreachable(deps, status).items()],
    }


# --------------------------------------------------------------------------- critical path

def critical_path(deps: Graph, durations: Mapping[str, float]) -> tuple[float, list[str]]:
    """The longest chain of dependent tasks, weighted by task duration.

    Args:
        deps: the task graph (dependencies outside it are ignored).
        durations: seq -> duration of that task (s in ftl; any unit, returned in the same unit).

    Returns:
        ``(length, path)``: the summed duration of the chain and its seqs, first task to run
        first. Ties go to the lowest seqs, so the result is deterministic. ``(0.0, [])`` for an
        empty graph. This is the lower bound on a campaign's wall-clock time with unlimited
        parallelism (used by the scheduler benchmark and by `critical_path_impact`).

    Raises:
        ValueError: a task has no duration, or a negative one.
        graphlib.CycleError: the graph has a cycle.
    """
    missing = [seq for seq in deps if seq not in durations]
    if missing:
        raise ValueError(f"no duration for task(s) {', '.join(_sorted(missing))}")
    negative = [seq for seq in deps if durations[seq] < 0]
    if negative:
        raise ValueError(f"negative duration for task(s) {', '.join(_sorted(negative))}")
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for seq in topological_order(deps):
        best: str | None = None
        for dep in _internal_deps(deps, seq):  # int order: a strict > keeps the lowest on ties
            if best is None or finish[dep] > finish[best]:
                best = dep
        finish[seq] = float(durations[seq]) + (finish[best] if best is not None else 0.0)
        via[seq] = best
    if not finish:
        return 0.0, []
    end = max(_sorted(finish), key=lambda seq: finish[seq])  # max keeps the first (lowest) on ties
    path: list[str] = []
    node: str | None = end
    while node is not None:
        path.append(node)
        node = via[node]
    return finish[end], path[::-1]


def critical_path_impact(deps: Graph, durations: Mapping[str, float], blocked_seq: str) -> dict:
    """How much of the plan a block at ``blocked_seq`` costs, measured against the critical path.

    The lost tasks are ``blocked_seq`` and every task downstream of it (none of them can complete
    without a re-plan). Used by CASCADE to rank blocks for re-planning.

    Returns:
        ``{"seq", "on_critical_path", "tasks_lost", "work_lost", "critical_work_lost",
        "critical_path_length", "remaining_critical_path_length"}``:
        ``on_critical_path`` is true when ``blocked_seq`` lies on `critical_path`'s path;
        ``tasks_lost`` counts the lost tasks; ``work_lost`` sums their durations;
        ``critical_work_lost`` sums the durations of the lost tasks on the critical path (the part
        of the critical path that runs through or after the block); ``critical_path_length`` is
        the plan's critical-path length and ``remaining_critical_path_length`` that of the tasks
        that can still run. Durations are in the caller's unit (s in ftl).

    Raises:
        ValueError: ``blocked_seq`` is not a task of the graph, or as for `critical_path`.
        graphlib.CycleError: the graph has a cycle.
    """
    if blocked_seq not in deps:
        raise ValueError(f"task {blocked_seq} is not in the graph")
    length, path = critical_path(deps, durations)
    lost = descendants(deps, blocked_seq) | {blocked_seq}
    remaining = {seq: [d for d in parents if d not in lost]
                 for seq, parents in deps.items() if seq not in lost}
    remaining_length, _ = critical_path(remaining, durations)
    return {
        "seq": blocked_seq,
        "on_critical_path": blocked_seq in path,
        "tasks_lost": len(lost),
        "work_lost": float(sum(durations[seq] for seq in lost)),
        "critical_work_lost": float(sum(durations[seq] for seq in path if seq in lost)),
        "critical_path_length": length,
        "remaining_critical_path_length": remaining_length,
    }
