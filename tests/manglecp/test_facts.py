"""Layer-1 fact validation (MangleCP spec 03, spec 09 §4.1; conformance items 14-16, 36, 44)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.manglecp.definitions import ServerLimits
from ftl.manglecp.facts import INT53_MAX, validate_facts
from ftl.manglecp.messages import FactsProfile, encode

from .helpers import FIXTURE_PREDICATES, final, intent, make_server

PROFILE = FactsProfile(predicates=list(FIXTURE_PREDICATES))


def _violations(facts):
    return validate_facts(facts, PROFILE)[1]


def test_bad_predicate_syntax_is_reported_per_fact():
    server = make_server()
    error = final(server.handle(intent("diag", [{"pred": "Bad-Name", "args": []},
                                                {"pred": "a" * 200, "args": []}])))
    payload = error["payload"]
    assert error["type"] == "error" and payload["code"] == "invalid_facts"
    assert [v["fact_index"] for v in payload["details"]["violations"]] == [0, 1]
    assert all(v["issue"] == "invalid_facts" for v in payload["details"]["violations"])


def test_reserved_prefix_alone_is_reserved_predicate_and_not_recoverable():
    server = make_server()
    error = final(server.handle(intent("diag", [{"pred": "_manglecp_x", "args": ["a"]}])))
    assert error["type"] == "error"
    assert (error["payload"]["code"], error["payload"]["recoverable"]) == ("reserved_predicate", False)


def test_mixed_batch_is_invalid_facts_with_every_violation_sorted():
    facts = [{"pred": "enable", "args": ["x"]},          # fine
             {"pred": "task", "args": ["001"]},          # arity
             {"pred": "_manglecp_y", "args": []},        # reserved
             {"pred": "enabel", "args": ["x"]},          # unknown, with suggestion
             {"pred": "task", "args": ["001", "big"]},   # type
             {"pred": "final", "args": ["t", 1]}]        # output-only
    error = final(make_server().handle(intent("diag", facts)))["payload"]
    assert error["code"] == "invalid_facts"
    violations = error["details"]["violations"]
    assert [v["fact_index"] for v in violations] == [1, 2, 3, 4, 5]
    by_index = {v["fact_index"]: v for v in violations}
    assert by_index[1]["issue"] == "arity_mismatch"
    assert (by_index[1]["expected_arity"], by_index[1]["actual_arity"]) == (2, 1)
    assert by_index[2]["issue"] == "reserved_predicate"
    assert by_index[3]["issue"] == "unknown_predicate" and by_index[3]["suggestion"] == "enable"
    assert by_index[4]["issue"] == "type_mismatch"
    assert (by_index[4]["argument_index"], by_index[4]["expected_type"], by_index[4]["actual_type"]) == (
        1, "number", "string")
    assert by_index[5]["issue"] == "invalid_facts" and "derived by the server" in by_index[5]["message"]
    for v in violations:
        assert {"fact_index", "predicate", "issue", "message"} <= set(v)


def test_single_kind_batch_uses_that_code():
    error = final(make_server().handle(intent("diag", [{"pred": "task", "args": [1, 2, 3]}])))["payload"]
    assert error["code"] == "arity_mismatch"
    assert error["details"]["violations"][0]["expected_arity"] == 2


def test_values_nulls_variables_big_ints_and_booleans():
    assert _violations([{"pred": "flag", "args": [True]}, {"pred": "blob", "args": [[1, {"a": 2.5}]]},
                        {"pred": "task", "args": ["1", {"_type": "int64", "value": str(2**60)}]}]) == []
    bad = _violations([{"pred": "blob", "args": [None]}, {"pred": "blob", "args": [{"_var": "X"}]},
                       {"pred": "task", "args": ["1", INT53_MAX + 1]},
                       {"pred": "flag", "args": [1]},
                       {"pred": "task", "args": ["1", True]}])
    assert [(v["fact_index"], v["issue"]) for v in bad] == [
        (0, "invalid_facts"), (1, "invalid_facts"), (2, "invalid_facts"), (3, "type_mismatch"),
        (4, "type_mismatch")]


def test_named_args_follow_arg_names():
    facts, violations = validate_facts([{"pred": "task", "named_args": {"size": 3, "seq": "001"}}], PROFILE)
    assert violations == [] and facts[0].args == ("001", 3)
    bad = _violations([{"pred": "task", "named_args": {"seq": "001"}},
                       {"pred": "flag", "named_args": {"x": True}},
                       {"pred": "task", "args": ["1", 2], "named_args": {"seq": "1", "size": 2}}])
    assert [v["fact_index"] for v in bad] == [0, 1, 2]


def test_temporal_annotations():
    ok, violations = validate_facts([
        {"pred": "seen", "args": ["deploy"], "t": {"at": "2026-02-19T14:30:00Z"}},
        {"pred": "seen", "args": ["build"], "t": {"start": 1771511400000, "end": "_"}},
        {"pred": "seen", "args": ["x"], "t": {"start": "_", "end": "now"}}], PROFILE)
    assert violations == [] and ok[0].t == (1771511400000, 1771511400000)
    bad = _violations([{"pred": "seen", "args": ["a"], "t": {"at": "yesterday"}},
                       {"pred": "seen", "args": ["a"], "t": {"start": 5, "end": 1}},
                       {"pred": "enable", "args": ["x"], "t": {"at": 1}}])
    assert [v["issue"] for v in bad] == ["invalid_facts"] * 3


def test_duplicates_collapse_and_source_is_not_identity():
    facts, violations = validate_facts([{"pred": "enable", "args": ["x"]},
                                        {"pred": "enable", "args": ["x"], "source": {"source_type": "client"}}],
                                       PROFILE)
    assert violations == [] and len(facts) == 1


def test_too_many_facts():
    server = make_server(limits=ServerLimits(max_facts_per_request=3))
    error = final(server.handle(intent("diag", [{"pred": "enable", "args": [str(i)]} for i in range(4)])))
    assert error["payload"]["code"] == "too_many_facts"
    assert error["payload"]["details"] == {"count": 4, "limit": 3}
    assert final(server.handle(intent("diag", [{"pred": "enable", "args": [str(i)]} for i in range(3)])))[
        "type"] == "intent_response"


def test_non_bmp_strings_are_accepted_as_utf8():
    server = make_server()
    raw = json.dumps(intent("diag", [{"pred": "enable", "args": ["🚀 x"]}]), ensure_ascii=False).encode("utf-8")
    reply = final(server.handle(raw))
    assert reply["type"] == "intent_response"
    assert not encode(reply).startswith(b"\xef\xbb\xbf")


_VALUES = st.one_of(st.text(max_size=3), st.integers(min_value=-2**60, max_value=2**60), st.booleans(),
                    st.floats(allow_nan=False), st.none(), st.lists(st.integers(), max_size=2))
_NAMES = st.sampled_from([p.predicate for p in FIXTURE_PREDICATES] + ["unknown", "Bad", "_manglecp_x"])
_FACT = st.one_of(
    st.fixed_dictionaries({"pred": _NAMES, "args": st.lists(_VALUES, max_size=3)}),
    st.fixed_dictionaries({"pred": _NAMES, "args": st.lists(_VALUES, max_size=3), "t": st.just({"at": "now"})}),
    st.fixed_dictionaries({"pred": _NAMES}), _VALUES)


@settings(max_examples=300, deadline=None)
@given(facts=st.lists(_FACT, max_size=8).map(lambda fs: fs + fs[:2]))  # with duplicates
def test_fast_path_validates_like_the_full_checks(facts):
    import ftl.manglecp.facts as facts_module

    fast = validate_facts(facts, PROFILE)
    saved = facts_module._profile_maps
    facts_module._profile_maps = lambda profile, reserved_ok: (saved(profile, reserved_ok)[0], {})
    try:
        full = validate_facts(facts, PROFILE)
    finally:
        facts_module._profile_maps = saved
    assert fast == full
    assert [f.key() for f in fast[0]] == [f.key() for f in full[0]]


# Mostly well-formed facts of the fast predicates (enable/1 string, task/2 string+number), so
# that whole batches pass `_validate_batch`; now and then a value of the wrong type, a bool,
# an int past 53 bits or an extra key sends the batch to the per-fact checks.
_NEAR_VALID = st.one_of(
    st.builds(lambda s: {"pred": "enable", "args": [s]}, st.text(max_size=2)),
    st.builds(lambda s, n: {"pred": "task", "args": [s, n]}, st.text(max_size=2),
              st.one_of(st.integers(-3, 3), st.just(True), st.just(INT53_MAX + 1), st.just(1.0))),
    st.builds(lambda s: {"pred": "enable", "args": [s], "t": None}, st.text(max_size=1)),
    st.builds(lambda n: {"pred": "enable", "args": [n]}, st.integers(0, 2)))


@settings(max_examples=300, deadline=None)
@given(facts=st.lists(_NEAR_VALID, max_size=10).map(lambda fs: fs + fs[:3]))  # with duplicates
def test_batch_validation_agrees_with_the_per_fact_checks(facts):
    import ftl.manglecp.facts as facts_module

    batch = validate_facts(facts, PROFILE)
    saved = facts_module._validate_batch
    facts_module._validate_batch = lambda facts, fast: None
    try:
        single = validate_facts(facts, PROFILE)
    finally:
        facts_module._validate_batch = saved
    assert batch == single
    assert [f.key() for f in batch[0]] == [f.key() for f in single[0]]


def test_a_batch_of_plain_facts_is_validated_as_a_whole():
    from ftl.manglecp.facts import _profile_maps, _validate_batch

    _, fast = _profile_maps(PROFILE, False)
    facts = [{"pred": "task", "args": ["001", 3]}, {"pred": "enable", "args": ["x"]},
             {"pred": "task", "args": ["001", 3]}]
    assert [tuple(f) for f in _validate_batch(facts, fast)] == [("task", ("001", 3), None),
                                                                ("enable", ("x",), None)]
    for odd in ({"pred": "task", "args": ["001", True]}, {"pred": "task", "args": ["001", 2**60]},
                {"pred": "enable", "args": ["x", "y"]}, {"pred": "flag", "args": [True]},
                {"pred": "enable", "args": ["x"], "t": None}, ["enable"]):
        assert _validate_batch(facts + [odd], fast) is None
