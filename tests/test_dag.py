"""Tests for ftl.dag: hand cases from FTL §6 and hypothesis properties on random DAGs."""

from __future__ import annotations

import graphlib
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ftl import dag
from ftl.models import Task, TaskStatus

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STATUSES = [s.value for s in TaskStatus]


# --------------------------------------------------------------------------- strategies

@st.composite
def dags(draw, min_size: int = 1, max_size: int = 12) -> dict[str, list[str]]:
    """A random DAG: seqs are increasing (not contiguous) numbers; a task depends only on lower seqs."""
    numbers = sorted(draw(st.sets(st.integers(1, 400), min_size=min_size, max_size=max_size)))
    seqs = [f"{n:03d}" for n in numbers]
    graph: dict[str, list[str]] = {}
    for index, seq in enumerate(seqs):
        earlier = seqs[:index]
        chosen = draw(st.sets(st.sampled_from(earlier), max_size=3)) if earlier else set()
        graph[seq] = sorted(chosen, key=int)
    return graph


@st.composite
def dags_with_status(draw) -> tuple[dict[str, list[str]], dict[str, str]]:
    graph = draw(dags())
    status = {seq: draw(st.sampled_from(STATUSES)) for seq in graph}
    return graph, status


@st.composite
def any_graphs(draw) -> dict[str, list[str]]:
    """Arbitrary directed graphs (cycles and self-loops allowed), deps only inside the graph."""
    seqs = [f"{n:03d}" for n in sorted(draw(st.sets(st.integers(1, 30), min_size=1, max_size=8)))]
    return {seq: sorted(draw(st.sets(st.sampled_from(seqs), max_size=3)), key=int) for seq in seqs}


def closure(graph: dict[str, list[str]]) -> dict[str, set[str]]:
    """Brute-force ancestor sets (fixpoint iteration), independent of ftl.dag's traversal."""
    anc = {seq: set(parents) for seq, parents in graph.items()}
    changed = True
    while changed:
        changed = False
        for seq in graph:
            extra = set().union(*(anc[p] for p in anc[seq])) - anc[seq] if anc[seq] else set()
            if extra:
                anc[seq] |= extra
                changed = True
    return anc


def is_closed_path_of_edges(graph: dict[str, list[str]], path: list[str]) -> bool:
    return (len(path) >= 2 and path[0] == path[-1] and len(set(path[:-1])) == len(path) - 1
            and all(b in graph[a] for a, b in itertools.pairwise(path)))


# --------------------------------------------------------------------------- cycles (FTL §6.3)

def test_two_cycle() -> None:
    graph = {"001": ["002"], "002": ["001"]}
    assert dag.find_cycle(graph) == ["001", "002", "001"]
    assert dag.format_cycle(dag.find_cycle(graph)) == "001 -> 002 -> 001"


def test_three_hop_cycle_behind_an_acyclic_prefix() -> None:
    graph = {"001": [], "002": ["001", "004"], "003": ["002"], "004": ["003"]}
    assert dag.find_cycle(graph) == ["002", "004", "003", "002"]


def test_self_dependency_is_a_one_node_cycle_and_rejected_by_the_model() -> None:
    assert dag.find_cycle({"001": ["001"]}) == ["001", "001"]
    with pytest.raises(ValidationError, match="depends on itself"):
        Task(seq="1", slug="a", verify="true", depends="001")


def test_deps_outside_the_graph_are_ignored_by_cycle_detection() -> None:
    graph = {"001": ["009"], "002": ["001"]}
    assert dag.find_cycle(graph) is None
    assert dag.dangling(graph) == [("001", "009")]
    assert dag.topological_order(graph) == ["001", "002"]


def test_find_cycle_on_a_deep_chain_does_not_recurse() -> None:
    graph = {f"{i:04d}": [f"{i - 1:04d}"] if i else [] for i in range(5000)}
    assert dag.find_cycle(graph) is None
    graph["0000"] = ["4999"]
    path = dag.find_cycle(graph)
    assert path is not None and len(path) == 5001 and is_closed_path_of_edges(graph, path)


@SETTINGS
@given(dags(min_size=2))
def test_a_back_edge_gives_a_real_closed_cycle(graph: dict[str, list[str]]) -> None:
    assert dag.find_cycle(graph) is None
    anc = closure(graph)
    with_ancestors = [seq for seq in graph if anc[seq]]
    if not with_ancestors:  # no edges at all: add one edge, then the back edge
        first, second = sorted(graph, key=int)[:2]
        graph[second] = [first]
        anc = closure(graph)
        with_ancestors = [second]
    child = with_ancestors[-1]
    ancestor = sorted(anc[child], key=int)[0]
    graph[ancestor] = sorted(set(graph[ancestor]) | {child}, key=int)  # back edge closes a cycle
    path = dag.find_cycle(graph)
    assert path is not None and is_closed_path_of_edges(graph, path)
    assert dag.find_cycle(graph) == path  # deterministic
    with pytest.raises(graphlib.CycleError) as info:
        dag.topological_order(graph)
    assert info.value.args[1] == path


@SETTINGS
@given(any_graphs())
def test_find_cycle_agrees_with_graphlib(graph: dict[str, list[str]]) -> None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
        acyclic = True
    except graphlib.CycleError:
        acyclic = False
    path = dag.find_cycle(graph)
    assert (path is None) == acyclic
    if path is not None:
        assert is_closed_path_of_edges(graph, path)


# --------------------------------------------------------------------------- order and reachability

def test_topological_order_breaks_ties_by_int_seq() -> None:
    graph = {"010": [], "002": [], "003": ["010"], "9": []}
    assert dag.topological_order(graph) == ["002", "9", "010", "003"]


@SETTINGS
@given(dags())
def test_topological_order_respects_every_dependency(graph: dict[str, list[str]]) -> None:
    order = dag.topological_order(graph)
    assert sorted(order) == sorted(graph)
    position = {seq: i for i, seq in enumerate(order)}
    assert all(position[p] < position[seq] for seq, parents in graph.items() for p in parents)
    # The generator only depends on lower seqs, so int order is itself topological and, being
    # the smallest possible order, is what ties-by-int-seq must produce.
    assert order == sorted(graph, key=int)


@SETTINGS
@given(dags())
def test_ancestors_and_descendants_match_the_closure(graph: dict[str, list[str]]) -> None:
    anc = closure(graph)
    for seq in graph:
        assert dag.ancestors(graph, seq) == anc[seq]
        assert dag.descendants(graph, seq) == {other for other in graph if seq in anc[other]}


# --------------------------------------------------------------------------- ready set (FTL §6.5)

def test_multi_parent_task_is_ready_only_when_every_parent_is_complete() -> None:
    graph = {"001": [], "002": [], "003": ["001", "002"]}
    assert dag.ready_set(graph, {"001": "complete", "002": "running"}) == []
    assert dag.ready_set(graph, {"001": "complete", "002": "complete"}) == ["003"]
    assert dag.ready_set(graph, {}) == ["001", "002"]  # no status entry counts as pending


def test_ready_set_reads_status_of_deps_outside_the_graph() -> None:
    assert dag.ready_set({"002": ["001"]}, {"001": TaskStatus.COMPLETE}) == ["002"]
    assert dag.ready_set({"002": ["001"]}, {}) == []


def test_unknown_status_is_rejected() -> None:
    with pytest.raises(ValueError):
        dag.ready_set({"001": []}, {"001": "done"})


@SETTINGS
@given(dags_with_status())
def test_ready_set_is_pending_tasks_with_complete_deps(case) -> None:
    graph, status = case
    expected = [seq for seq in sorted(graph, key=int) if status[seq] == "pending"
                and all(status[p] == "complete" for p in graph[seq])]
    assert dag.ready_set(graph, status) == expected


# --------------------------------------------------------------------------- unreachable / propagate

def test_grandchildren_of_a_blocked_task_are_unreachable_too() -> None:
    # FTL saw only 002 here (§8.2-10); 003 and 004 can never run either.
    graph = {"001": [], "002": ["001"], "003": ["002"], "004": ["003"], "005": []}
    status = {"001": "blocked", "005": "complete"}
    assert dag.unreachable(graph, status) == {"002": ["001"], "003": ["001"], "004": ["001"]}
    assert dag.propagate_blocks(graph, status) == [("002", ["001"]), ("003", ["001"]),
                                                    ("004", ["001"])]


def test_roots_are_where_blocks_originated() -> None:
    # 003 was blocked by propagation from 001; 002 failed on its own; 005 waits on both lines.
    graph = {"001": [], "002": [], "003": ["001"], "004": ["003", "002"], "005": ["004"]}
    status = {"001": "blocked", "002": "blocked", "003": "blocked"}
    assert dag.unreachable(graph, status) == {"004": ["001", "002"], "005": ["001", "002"]}


@SETTINGS
@given(dags_with_status())
def test_unreachable_is_every_pending_task_with_a_blocked_ancestor(case) -> None:
    graph, status = case
    anc = closure(graph)
    blocked = {seq for seq in graph if status[seq] == "blocked"}
    expected = {seq for seq in graph if status[seq] == "pending" and anc[seq] & blocked}
    result = dag.unreachable(graph, status)
    assert set(result) == expected
    assert list(result) == sorted(result, key=int)
    for seq, roots in result.items():
        assert roots, "every unreachable task names at least one root block"
        assert roots == sorted(roots, key=int)
        assert set(roots) == {b for b in anc[seq] & blocked if not anc[b] & blocked}


@SETTINGS
@given(dags_with_status())
def test_propagating_blocks_reaches_a_fixpoint_and_keeps_roots(case) -> None:
    graph, status = case
    propagated = dag.propagate_blocks(graph, status)
    assert dict(propagated) == dag.unreachable(graph, status)
    after = dict(status) | {seq: "blocked" for seq, _ in propagated}
    assert dag.propagate_blocks(graph, after) == []
    assert dag.cascade_status(graph, after)["unreachable"] == []
    # Roots are stable: after blocking part of the unreachable set, the rest keeps its roots.
    partial = dict(status) | {seq: "blocked" for seq, _ in propagated[: len(propagated) // 2]}
    remaining = dag.unreachable(graph, partial)
    assert remaining == dict(propagated[len(propagated) // 2:])
    # Once blocks are propagated, a campaign with nothing running is never stuck in a DAG.
    if not any(v == "running" for v in after.values()):
        assert dag.cascade_status(graph, after)["state"] != "stuck"


# --------------------------------------------------------------------------- cascade-status

@pytest.mark.parametrize(("status", "state"), [
    ({}, "in_progress"),
    ({"001": "complete", "002": "complete", "003": "complete"}, "complete"),
    ({"001": "blocked", "002": "blocked", "003": "blocked"}, "all_blocked"),  # FTL said "complete"
    ({"001": "complete", "002": "blocked", "003": "blocked"}, "all_blocked"),
    ({"001": "running", "002": "complete"}, "in_progress"),  # FTL said "all_blocked"
    ({"001": "blocked", "002": "complete"}, "stuck"),
])
def test_cascade_state_names(status: dict[str, str], state: str) -> None:
    graph = {"001": [], "002": [], "003": ["001", "002"]}
    assert dag.cascade_status(graph, status)["state"] == state


def test_cascade_status_shape_and_empty_plan() -> None:
    graph = {"001": [], "002": ["001"], "003": ["002"]}
    assert dag.cascade_status(graph, {"001": "blocked"}) == {
        "state": "stuck", "complete": 0, "blocked": 1, "pending": 2, "running": 0, "ready": 0,
        "unreachable": [{"seq": "002", "blocked_by": ["001"]}, {"seq": "003", "blocked_by": ["001"]}],
    }
    assert dag.cascade_status({}, {}) == {"state": "complete", "complete": 0, "blocked": 0,
                                          "pending": 0, "running": 0, "ready": 0, "unreachable": []}


def test_stuck_on_a_dependency_outside_the_graph() -> None:
    assert dag.cascade_status({"002": ["001"]}, {})["state"] == "stuck"


@SETTINGS
@given(dags_with_status())
def test_cascade_status_follows_its_table(case) -> None:
    graph, status = case
    result = dag.cascade_status(graph, status)
    counts = {s: sum(1 for v in status.values() if v == s) for s in STATUSES}
    assert {k: result[k] for k in STATUSES} == counts
    ready = dag.ready_set(graph, status)
    assert result["ready"] == len(ready)
    if counts["complete"] == len(graph):
        assert result["state"] == "complete"
    elif ready or counts["running"]:
        assert result["state"] == "in_progress"
    elif counts["pending"] == 0:
        assert result["state"] == "all_blocked" and counts["blocked"] > 0
    else:
        assert result["state"] == "stuck"
        # Nothing can move: every pending task waits on something that is not complete.
        assert all(any(status[p] != "complete" for p in graph[seq])
                   for seq in graph if status[seq] == "pending")


# --------------------------------------------------------------------------- critical path

def test_critical_path_hand_case() -> None:
    graph = {"001": [], "002": ["001"], "003": ["001"], "004": ["002", "003"]}
    durations = {"001": 1.0, "002": 5.0, "003": 2.0, "004": 1.0}
    assert dag.critical_path(graph, durations) == (7.0, ["001", "002", "004"])
    impact = dag.critical_path_impact(graph, durations, "002")
    assert impact == {"seq": "002", "on_critical_path": True, "tasks_lost": 2, "work_lost": 6.0,
                      "critical_work_lost": 6.0, "critical_path_length": 7.0,
                      "remaining_critical_path_length": 3.0}
    off = dag.critical_path_impact(graph, durations, "003")
    assert off["on_critical_path"] is False and off["critical_work_lost"] == 1.0  # 004 only


def test_critical_path_ties_and_errors() -> None:
    graph = {"001": [], "002": [], "003": ["001", "002"]}
    assert dag.critical_path(graph, dict.fromkeys(graph, 1.0)) == (2.0, ["001", "003"])
    assert dag.critical_path({}, {}) == (0.0, [])
    with pytest.raises(ValueError, match="003"):
        dag.critical_path(graph, {"001": 1.0, "002": 1.0})
    with pytest.raises(ValueError, match="negative"):
        dag.critical_path(graph, {"001": -1.0, "002": 1.0, "003": 1.0})
    with pytest.raises(ValueError, match="not in the graph"):
        dag.critical_path_impact(graph, dict.fromkeys(graph, 1.0), "009")


@SETTINGS
@given(dags(), st.data())
def test_critical_path_is_the_longest_chain(graph: dict[str, list[str]], data) -> None:
    durations = {seq: data.draw(st.integers(0, 20)) for seq in graph}
    length, path = dag.critical_path(graph, durations)
    assert all(a in graph[b] for a, b in itertools.pairwise(path))
    assert length == sum(durations[seq] for seq in path)
    best: dict[str, int] = {}  # brute force: the generator lists tasks in topological order
    for seq in sorted(graph, key=int):
        best[seq] = durations[seq] + max((best[p] for p in graph[seq]), default=0)
    assert length == max(best.values())
    blocked = data.draw(st.sampled_from(sorted(graph)))
    impact = dag.critical_path_impact(graph, durations, blocked)
    assert impact["tasks_lost"] == 1 + len(dag.descendants(graph, blocked))
    assert impact["remaining_critical_path_length"] <= length
    assert impact["on_critical_path"] == (blocked in path)
    if not impact["on_critical_path"]:
        assert impact["critical_work_lost"] <= impact["work_lost"]


def test_status_texts_are_the_models_statuses():
    # dag compares plain strings so that reading commands never import the pydantic models
    assert dag.STATUSES == tuple(s.value for s in TaskStatus)


def test_unknown_status_is_a_value_error():
    with pytest.raises(ValueError, match="not a valid task status"):
        dag.ready_set({"001": []}, {"001": "in_progress"})
