"""Selection contracts C1-C6, limits and failure modes of the clingo evaluator (spec 05 §3,
conformance items 17-19, 23-25, 28-31, 37)."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftl.manglecp.definitions import EvaluationInput, ServerLimits
from ftl.manglecp.facts import NormalFact
from ftl.server.evaluation.symbols import to_symbol

from .helpers import final, intent, make_server, tools_by_name


def _names(reply):
    return set(tools_by_name(final(reply)))


@pytest.fixture
def srv():
    server = make_server()
    yield server
    server.close()


def test_c1_c2_relevance_and_exclusion(srv):
    names = _names(srv.handle(intent("diag")))
    assert "mandatory_tool" in names                 # skeleton
    assert "prohibited_tool" not in names            # C2: prohibited despite score 95
    assert "other_tool" not in names                 # C1: belongs to intent `other`
    assert _names(srv.handle(intent("other"))) == {"other_tool"}


def test_uncovered_intent_gives_empty_list_not_error(srv):
    reply = final(srv.handle(intent("nobody_serves_this")))
    assert reply["type"] == "intent_response" and reply["payload"]["macro_tools"] == []
    assert "eval_time_used" in reply["payload"]


def test_c3_equal_score_conflict_keeps_smaller_name_every_time(srv):
    for _ in range(5):
        names = _names(srv.handle(intent("diag")))
        assert "pair_a" in names and "pair_b" not in names


def test_c4_dependency_added_or_dependent_dropped(srv):
    tools = tools_by_name(final(srv.handle(intent("diag"))))
    assert {"dependent_tool", "helper_tool"} <= set(tools)
    assert tools["helper_tool"]["metadata"] == {"selection_phase": "dependency", "score": 80}
    blocked = _names(srv.handle(intent("diag", [{"pred": "block_helper", "args": []}])))
    assert "dependent_tool" not in blocked and "helper_tool" not in blocked


def test_fresh_store_per_request(srv):
    assert "enabled_tool" in _names(srv.handle(intent("diag", [{"pred": "enable", "args": ["x"]}])))
    assert "enabled_tool" not in _names(srv.handle(intent("diag")))


def _signature(reply):
    payload = final(reply)["payload"]
    return sorted((t["macro_id"], t["disclosure_level"], t.get("metadata", {}).get("score"))
                  for t in payload["macro_tools"]), {k: v for k, v in payload.items()
                                                     if k not in ("diagnostics", "eval_duration_ms")}


def test_c6_determinism_100_runs_and_shuffled_facts():
    facts = [{"pred": "enable", "args": ["x"]}, {"pred": "enable", "args": ["y"]},
             {"pred": "task", "args": ["001", 3]}, {"pred": "flag", "args": [False]}]
    first = make_server()
    second = make_server()  # another server instance: ids do not depend on the process or instance
    expected = _signature(first.handle(intent("diag", facts, eval_time="2026-02-19T14:30:00Z")))
    rng = random.Random(7)
    for run in range(100):
        shuffled = facts[:]
        rng.shuffle(shuffled)
        server = first if run % 2 else second
        assert _signature(server.handle(intent("diag", shuffled, eval_time="2026-02-19T14:30:00Z"))) == expected
    first.close()
    second.close()


def test_gas_limit_trips_with_budget_and_no_tools(srv):
    reply = final(srv.handle(intent("heavy", constraints={"max_facts_created": 10})))
    payload = reply["payload"]
    assert reply["type"] == "error" and payload["code"] == "derivation_limit_exceeded"
    assert payload["recoverable"] is True
    budget = payload["details"]["budget"]
    assert budget["limit"] == 10 and budget["consumed"] >= 10 and budget["unit"] == "derived_facts"
    assert payload["details"]["partial_results_available"] is False
    assert "macro_tools" not in str(reply)
    assert final(srv.handle(intent("heavy")))["type"] == "intent_response"


def test_constraints_merge_to_the_server_limit():
    server = make_server(limits=ServerLimits(max_derived_facts=30))
    payload = final(server.handle(intent("heavy", constraints={"max_facts_created": 300})))["payload"]
    assert payload["code"] == "derivation_limit_exceeded"
    assert payload["details"]["budget"]["limit"] == 30
    server.close()


def test_unstratified_rules_fail_instead_of_picking_a_model(srv):
    payload = final(srv.handle(intent("unstratified")))["payload"]
    assert (payload["code"], payload["recoverable"]) == ("evaluation_failed", False)


def test_eval_time_is_echoed_and_drives_temporal_rules(srv, clock):
    deploy = {"pred": "seen", "args": ["deploy"], "t": {"at": "2026-02-19T14:30:00Z"}}
    four_min = final(srv.handle(intent("temporal", [deploy], eval_time="2026-02-19T14:34:00Z")))
    assert four_min["payload"]["eval_time_used"] == "2026-02-19T14:34:00Z"
    assert "recent_tool" in tools_by_name(four_min)
    six_min = final(srv.handle(intent("temporal", [deploy], eval_time="2026-02-19T14:36:00Z")))
    assert "recent_tool" not in tools_by_name(six_min)
    no_time = final(srv.handle(intent("temporal")))
    assert no_time["payload"]["eval_time_used"] == "2026-02-19T14:10:00.000Z"  # the fake wall clock


def test_timeout_kills_the_worker_and_the_next_request_works(process_evaluator):
    server = make_server(evaluator=process_evaluator)
    reply = final(server.handle(intent("slow", constraints={"max_compute_ms": 50})))
    payload = reply["payload"]
    assert (payload["code"], payload["recoverable"]) == ("evaluation_timeout", True)
    assert payload["details"]["budget"]["limit"] == 50 and payload["details"]["budget"]["unit"] == "ms"
    assert "mandatory_tool" in tools_by_name(final(server.handle(intent("diag"))))


def test_process_evaluator_gives_the_same_answer_as_in_process(process_evaluator, srv):
    assert _signature(make_server(evaluator=process_evaluator).handle(intent("diag", eval_time=0))) == \
        _signature(srv.handle(intent("diag", eval_time=0)))


def test_cancel_stops_an_evaluation(process_evaluator):
    cancel = threading.Event()
    cancel.set()
    request = EvaluationInput("slow", {}, (), 0, 1000, 60_000, cancel=cancel)
    with pytest.raises(Exception) as exc:
        process_evaluator.evaluate(request)
    assert getattr(exc.value, "code", None) == "cancelled"
    result = process_evaluator.evaluate(EvaluationInput("diag", {}, (NormalFact("enable", ("x",)),), 0, 1000))
    assert "enabled_tool" in {s.tool for s in result.selections}


def test_symbol_encoding_keeps_big_ints_and_floats_apart():
    assert str(to_symbol(2**40)) == 'big("1099511627776")'
    assert str(to_symbol(7)) == "7"
    assert str(to_symbol(1.5)) == 'float("1.5")'
    assert str(to_symbol({"b": True, "a": [1]})) == 'map(kv("a",list(1)),kv("b",true))'


_SEQS = st.sampled_from(["001", "002", "010", "999"])
_FTL_FACTS = st.lists(st.one_of(
    st.tuples(st.just("task"), st.tuples(_SEQS, st.sampled_from(["BUILD", "SPEC", "VERIFY"]))),
    st.tuples(st.just("task_has_run"), st.tuples(_SEQS)),
    st.tuples(st.just("blocked"), st.tuples(_SEQS)),
    st.tuples(st.just("builder_requested"), st.tuples(_SEQS, st.sampled_from(["shell", "agent"]))),
    st.tuples(st.just("framework"), st.tuples(st.text("abc", min_size=1, max_size=3))),
    st.tuples(st.just("explorer_mode"), st.tuples(st.sampled_from(["structure", "delta", "other"])))),
    max_size=12, unique=True)


@pytest.fixture(scope="module")
def ftl_program(tmp_path_factory):
    from ftl.config import Config
    from ftl.server.app import build_server

    server = build_server(tmp_path_factory.mktemp("eval"), Config(agent_command=["a"]), isolation="thread")
    yield server.evaluator._program
    server.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(facts=_FTL_FACTS, intent_name=st.sampled_from(["build_task", "verify_task", "explore_codebase",
                                                      "analyze_cascade"]),
       hidden=st.sampled_from([[], ["shell_builder"]]), limit=st.sampled_from([100_000, 3]))
def test_counted_path_answers_like_the_atom_by_atom_path(ftl_program, facts, intent_name, hidden, limit):
    # the fast path counts derived atoms instead of looking each one up; both must agree exactly
    request = {"intent": intent_name, "params": {}, "facts": [(p, a, None) for p, a in facts],
               "eval_time_ms": 0, "max_facts_created": limit, "hidden": hidden}
    counted = ftl_program.run(request)
    ftl_program._reserved_heads = True  # forces the full loop
    try:
        full = ftl_program.run(request)
    finally:
        ftl_program._reserved_heads = False
    assert counted == full


def test_plain_facts_take_the_counted_path_and_temporal_ones_do_not(ftl_program, monkeypatch):
    taken = []
    counted = ftl_program._run_counted
    monkeypatch.setattr(ftl_program, "_run_counted", lambda *a: taken.append(1) or counted(*a))
    request = {"intent": "build_task", "params": {}, "eval_time_ms": 0, "max_facts_created": 100_000,
               "facts": [("task", ("001", "BUILD"), None), ("task_has_run", ("001",), None)]}
    assert ftl_program.run(request)["ok"]["selections"][0][0] == "shell_builder"
    assert taken == [1]
    ftl_program.run({**request, "facts": [("task", ("001", "BUILD"), (0, 1000))]})
    ftl_program.run({**request, "explain": True})
    for odd in ([("framework", ({"a": [1]},), None)], [("framework", (True,), None)], [("task", (1.5, "x"), None)]):
        assert "ok" in ftl_program.run({**request, "facts": odd})  # nested, bool, float: full path
    assert taken == [1]


def test_counted_path_counts_duplicate_facts_once(ftl_program):
    facts = [("task", ("001", "BUILD"), None), ("task_has_run", ("001",), None)]
    request = {"intent": "build_task", "params": {}, "eval_time_ms": 0, "max_facts_created": 100_000}
    once = ftl_program.run({**request, "facts": facts})
    twice = ftl_program.run({**request, "facts": facts + facts[::-1]})
    ftl_program._symbols.clear()  # duplicates that are all cache misses
    fresh = ftl_program.run({**request, "facts": facts + facts})
    assert once == twice == fresh


# --------------------------------------------------------------------------- isolation under limits

def _diag(**kwargs) -> EvaluationInput:
    return EvaluationInput("diag", {}, (), 0, 1000, kwargs.pop("max_compute_ms", 2000), **kwargs)


def _bounded_slow_evaluator(tmp_path):
    """A thread-isolated evaluator whose ``slowish`` intent grounds for about a second and then
    ends: an evaluation abandoned on timeout finishes soon (the fixture's ``slow`` would run for
    minutes, gigabytes large, in the test process)."""
    from ftl.server.evaluation.workers import ClingoEvaluator

    from .helpers import FIXTURE_RULES, FIXTURE_TOOLS

    rules = tmp_path / "slowish.lp"
    rules.write_text('slowish(0) :- intent("slowish").\nslowish(N + 1) :- slowish(N), N < 1500000.\n')
    return ClingoEvaluator([*FIXTURE_RULES, rules], [("tool", [n]) for n in FIXTURE_TOOLS],
                           isolation="thread")


def _abandoned_threads_end() -> None:
    for thread in threading.enumerate():
        if thread.name == "ftl-eval":
            thread.join(60)
            assert not thread.is_alive()


def test_a_thread_timeout_does_not_stall_later_evaluations(tmp_path):
    # The abandoned grounding thread keeps its program and lock; later requests get fresh ones
    # (before: each of them waited for the lock until its own clock ran out, thread by thread).
    import time

    from ftl.manglecp.messages import ProtocolError

    evaluator = _bounded_slow_evaluator(tmp_path)
    with pytest.raises(ProtocolError) as slow:
        evaluator.evaluate(EvaluationInput("slowish", {}, (), 0, 10**9, 100))
    assert slow.value.code == "evaluation_timeout"
    for _ in range(3):
        started = time.monotonic()
        assert evaluator.evaluate(_diag()).selections
        assert time.monotonic() - started < 1.5
    assert sum(thread.name == "ftl-eval" for thread in threading.enumerate()) <= 1
    _abandoned_threads_end()


def test_a_request_waiting_for_a_busy_worker_keeps_its_cancel_and_limit():
    import time

    from ftl.manglecp.messages import ProtocolError
    from ftl.server.evaluation.workers import ClingoEvaluator

    from .helpers import FIXTURE_RULES, FIXTURE_TOOLS

    evaluator = ClingoEvaluator(FIXTURE_RULES, [("tool", [n]) for n in FIXTURE_TOOLS],
                                isolation="process", workers=1)
    try:
        evaluator.warm()
        hog = threading.Thread(target=lambda: pytest.raises(
            ProtocolError, evaluator.evaluate, EvaluationInput("slow", {}, (), 0, 10**9, 3000)))
        hog.start()
        time.sleep(0.3)  # the only worker is busy
        cancel = threading.Event()
        cancel.set()
        started = time.monotonic()
        with pytest.raises(ProtocolError) as cancelled:
            evaluator.evaluate(_diag(cancel=cancel))
        assert cancelled.value.code == "cancelled" and time.monotonic() - started < 1.0
        with pytest.raises(ProtocolError) as late:
            evaluator.evaluate(_diag(max_compute_ms=300))
        assert late.value.code == "evaluation_timeout" and time.monotonic() - started < 2.0
        hog.join(10)
    finally:
        evaluator.close()


def test_a_worker_that_died_idle_is_replaced_not_reported_as_out_of_memory():
    import os
    import signal
    import time

    from .helpers import make_evaluator

    evaluator = make_evaluator("process")
    try:
        evaluator.warm()
        os.kill(evaluator._idle[0].process.pid, signal.SIGKILL)
        time.sleep(0.2)
        assert evaluator.evaluate(_diag()).selections  # before: derivation_limit_exceeded
    finally:
        evaluator.close()


def test_a_worker_that_cannot_start_is_evaluation_failed_and_leaks_no_descriptor(monkeypatch):
    import os

    from ftl.manglecp.messages import ProtocolError
    from ftl.server.evaluation import workers

    from .helpers import make_evaluator

    evaluator = make_evaluator("process")
    monkeypatch.setattr(workers.sys, "executable", "/nonexistent/python")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        with pytest.raises(ProtocolError) as failed:
            evaluator.evaluate(_diag())
        assert failed.value.code == "evaluation_failed"
    assert len(os.listdir("/proc/self/fd")) == before and evaluator._count == 0


def test_a_request_waiting_when_the_one_ahead_times_out_moves_to_the_fresh_program(tmp_path):
    import time

    from ftl.manglecp.messages import ProtocolError

    evaluator = _bounded_slow_evaluator(tmp_path)
    outcome: dict = {}

    def slow() -> None:
        try:
            evaluator.evaluate(EvaluationInput("slowish", {}, (), 0, 10**9, 300))
        except ProtocolError as error:
            outcome["slow"] = error.code

    ahead = threading.Thread(target=slow)
    ahead.start()
    time.sleep(0.1)  # the slow one holds the program; this one waits for it
    started = time.monotonic()
    assert evaluator.evaluate(_diag(max_compute_ms=8000)).selections
    assert time.monotonic() - started < 3.0  # before: it waited out its own 8 s
    ahead.join(10)
    assert outcome == {"slow": "evaluation_timeout"}
    _abandoned_threads_end()
