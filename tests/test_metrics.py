"""ftl.telemetry.metrics: the counters on ftl's own registry, derived from the event log by
EventMetrics, with bounded label values, no *_created series, and byte-identical dumps of the
same run (reference §3.2, §5 rule 5)."""

from __future__ import annotations

from collections import Counter as Tally
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.telemetry import metrics as metrics_module
from ftl.errors import REGISTRY
from ftl.events import EventLog, read_events
from ftl.telemetry.metrics import MAX_LABEL_VALUES, OTHER, EventMetrics, Metrics

LOGS = Path(__file__).resolve().parent / "logs"


def sample(m: Metrics, name: str, **labels: str) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def test_counters_render_without_created_series() -> None:
    m = Metrics()
    m.count_error("policy_denied")
    m.count_gate("policy", "deny")
    m.count_retry("timeout", "retried")
    m.count_task("complete")
    body, content_type = m.render()
    text = body.decode()
    assert content_type.startswith("text/plain")
    assert "_created" not in text
    assert 'ftl_errors_total{category="authorization",code="policy_denied",gate="policy"} 1.0' in text
    assert 'ftl_gate_decisions_total{gate="policy",outcome="deny"} 1.0' in text
    assert 'ftl_retries_total{kind="timeout",outcome="retried"} 1.0' in text
    assert 'ftl_tasks_total{status="complete"} 1.0' in text


def test_error_labels_come_from_the_registry_row() -> None:
    m = Metrics()
    m.count_error("verify_failed")
    m.count_error("approval_timeout")
    m.count_error("no_such_kind")  # fails closed like ftl.errors.kind
    m.count_error("conflict", gate="governance")
    assert sample(m, "ftl_errors_total", code="verify_failed", gate="none", category="validation") == 1
    assert sample(m, "ftl_errors_total", code="approval_timeout", gate="approval", category="unavailable") == 1
    assert sample(m, "ftl_errors_total", code="internal_error", gate="none", category="internal") == 1
    assert sample(m, "ftl_errors_total", code="conflict", gate="governance", category="conflict") == 1


def test_count_gate_refuses_an_unknown_gate() -> None:
    with pytest.raises(ValueError, match="unknown gate"):
        Metrics().count_gate("firewall", "deny")


def test_label_values_are_bounded() -> None:
    m = Metrics()
    for i in range(MAX_LABEL_VALUES + 10):
        m.count_gate("approval", f"outcome_{i}")
    m.count_task("Not A Label!")
    text = m.render()[0].decode()
    outcomes = {line.split('outcome="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("ftl_gate_decisions_total{")}
    assert len(outcomes) == MAX_LABEL_VALUES + 1 and OTHER in outcomes
    assert sample(m, "ftl_gate_decisions_total", gate="approval", outcome=OTHER) == 10
    assert sample(m, "ftl_tasks_total", status=OTHER) == 1


def test_event_metrics_listens_to_a_real_event_log(tmp_path: Path) -> None:
    m = Metrics()
    seen: list[str] = []
    with EventLog(tmp_path / "c1.jsonl", "c1") as log:
        log.subscribe(EventMetrics(m, then=lambda e: seen.append(e["event"])))
        log.emit("TOOL_FAILURE", state="BUILD", tool="shell_builder", error_type="flaky_test")
        log.emit("RETRY", state="BUILD", tool="shell_builder", error_type="flaky_test", attempt=2)
        log.emit("TOOL_FAILURE", state="BUILD", tool="shell_builder", error_type="verify_failed")
        log.emit("RECOVERY_ATTEMPT", state="BUILD", strategy="block_task", success=True,
                 error_type="verify_failed")
        log.emit("RECOVERY_ATTEMPT", state="CASCADE", strategy="replan", success=False)
        log.emit("TASK_END", state="EXECUTE", task_seq="001", status="blocked")
        log.emit("STATE_ENTRY", state="OBSERVE")
    assert sample(m, "ftl_errors_total", code="flaky_test", gate="none", category="validation") == 1
    assert sample(m, "ftl_errors_total", code="verify_failed", gate="none", category="validation") == 1
    assert sample(m, "ftl_retries_total", kind="flaky_test", outcome="retried") == 1
    assert sample(m, "ftl_retries_total", kind="verify_failed", outcome="recovered") == 1
    assert sample(m, "ftl_retries_total", kind="none", outcome="unrecovered") == 1
    assert sample(m, "ftl_tasks_total", status="blocked") == 1
    assert seen[-1] == "STATE_ENTRY" and len(seen) == 7  # the chained listener saw every event


def test_a_failing_count_never_stops_the_chained_listener() -> None:
    class Broken(Metrics):
        def count_task(self, status):  # noqa: ANN001
            raise RuntimeError("disk full")

    seen: list[dict] = []
    listener = EventMetrics(Broken(), then=seen.append)
    with pytest.raises(RuntimeError):
        listener({"event": "TASK_END", "status": "complete"})
    assert seen == [{"event": "TASK_END", "status": "complete"}]


@pytest.mark.parametrize("log_name", sorted(p.name for p in LOGS.glob("*.jsonl")))
def test_counts_equal_the_events_of_recorded_logs(log_name: str) -> None:
    events = list(read_events(LOGS / log_name))
    m = Metrics()
    listener = EventMetrics(m)
    for event in events:
        listener(event)
    failures = Tally(e.get("error_type") or "internal_error" for e in events if e["event"] == "TOOL_FAILURE")
    for error_type, count in failures.items():
        row = REGISTRY[error_type]
        assert sample(m, "ftl_errors_total", code=error_type, gate=row.gate or "none",
                      category=row.v2_error_type) == count
    ends = Tally(e.get("status") for e in events if e["event"] == "TASK_END")
    for status, count in ends.items():
        assert sample(m, "ftl_tasks_total", status=status) == count
    retries = sum(1 for e in events if e["event"] in ("RETRY", "RECOVERY_ATTEMPT"))
    body = m.render()[0].decode()
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                  if line.startswith("ftl_retries_total{"))
    assert counted == retries


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["TOOL_FAILURE", "RETRY", "RECOVERY_ATTEMPT", "TASK_END", "X"]),
                          st.sampled_from(sorted(REGISTRY) + [None, "bogus"]),
                          st.sampled_from(["complete", "blocked", "pending", None]),
                          st.booleans()), max_size=30))
def test_same_events_give_byte_identical_dumps(events) -> None:
    dumps = []
    for _ in range(2):
        m = Metrics()
        listener = EventMetrics(m)
        for name, error_type, status, success in events:
            listener({"event": name, "error_type": error_type, "status": status, "success": success})
        dumps.append(m.render()[0])
    assert dumps[0] == dumps[1]


def test_write_textfile_is_atomic_and_equals_render(tmp_path: Path) -> None:
    m = Metrics()
    m.count_task("complete")
    target = m.write_textfile(tmp_path / "node" / "ftl.prom")
    assert target.read_bytes() == m.render()[0]
    assert [p.name for p in target.parent.iterdir()] == ["ftl.prom"]  # no temp file left


def test_module_helpers_use_the_process_registry(tmp_path: Path) -> None:
    before = sample(metrics_module.METRICS, "ftl_gate_decisions_total", gate="visibility", outcome="pass")
    metrics_module.count_gate("visibility", "pass")
    metrics_module.count_error("rate_limited")
    assert sample(metrics_module.METRICS, "ftl_gate_decisions_total", gate="visibility",
                  outcome="pass") == before + 1
    body, _ = metrics_module.render()
    assert b'code="rate_limited"' in body
    assert metrics_module.write_textfile(tmp_path / "m.prom").read_bytes() == metrics_module.render()[0]


# --- issue 15 item 4: a campaign's gate decisions in its own metrics, counted once in process

def _sample(registry, name: str, **labels) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_in_process_campaign_counts_each_gate_decision_once(tmp_path) -> None:
    import sys

    from ftl.config import Config
    from ftl.events import read_events
    from ftl.telemetry.metrics import METRICS, EventMetrics
    from ftl.engine.runner import Runner, connect_in_process

    reject_002 = [sys.executable, "-c", "import json, sys; call = json.load(sys.stdin); "
                  "sys.exit(1 if call['args']['workspace']['seq'] == '002' else 0)"]
    gates = {"governance": {"rules": [{"match": {"tool": "shell_builder"}, "action": "approve"}]},
             "approval": {"mode": "command", "command": reject_002, "timeout_s": 30}}
    tasks = [{"seq": seq, "slug": f"t{seq}", "creates": [f"out/{seq}"], "budget": 1,
              "run": f"mkdir -p out && touch out/{seq}", "verify": f"test -f out/{seq}"}
             for seq in ("001", "002")]
    registry = METRICS.registry  # the process-wide counters: where the gate would count too
    approved = ("ftl_gate_decisions_total", {"gate": "approval", "outcome": "approved"})
    governance = ("ftl_gate_decisions_total", {"gate": "governance", "outcome": "approve"})
    rejected = ("ftl_gate_denials_total", {"gate": "approval", "reason": "approval_rejected"})
    before = {key[0] + str(key[1]): _sample(registry, key[0], **key[1])
              for key in (approved, governance, rejected)}
    config = Config(jobs=1, explorer_timeout_s=30, retry_backoff_min_s=0.01, gates=gates)
    result = Runner(tmp_path, config, client_factory=connect_in_process,
                    on_event=EventMetrics(METRICS)).start("gated", plan_input={
                        "objective": "gated", "tasks": tasks})
    assert result.exit_code == 3
    delta = {key[0] + str(key[1]): _sample(registry, key[0], **key[1]) - before[key[0] + str(key[1])]
             for key in (approved, governance, rejected)}
    assert delta == {approved[0] + str(approved[1]): 1, governance[0] + str(governance[1]): 1,
                     rejected[0] + str(rejected[1]): 1}
    decisions = [e for e in read_events(result.log_path) if e["event"] == "GATE_DECISION"
                 and e["tool"] == "shell_builder"]
    assert [(e["task_seq"], e["outcome"], e.get("reason")) for e in decisions] == [
        ("001", "approved", None), ("002", "deny", "approval_rejected")]
    assert decisions[0]["gates"] == {"visibility": "pass", "governance": "approve",
                                     "approval": "approved"}


def test_event_metrics_counts_gate_decision_events() -> None:
    m = Metrics()
    listener = EventMetrics(m)
    listener({"event": "GATE_DECISION", "tool": "x", "outcome": "allow",
              "gates": {"visibility": "pass", "governance": "policy", "policy": "allow"}})
    listener({"event": "GATE_DECISION", "tool": "x", "outcome": "deny",
              "gates": {"policy": "deny"}, "denied_by": "policy", "reason": "policy_denied"})
    listener({"event": "GATE_DECISION", "tool": "x", "outcome": "deny",
              "gates": {"nonsense": "deny"}, "denied_by": "nonsense", "reason": "x"})
    reg = m.registry
    assert _sample(reg, "ftl_gate_decisions_total", gate="policy", outcome="allow") == 1
    assert _sample(reg, "ftl_gate_decisions_total", gate="policy", outcome="deny") == 1
    assert _sample(reg, "ftl_gate_decisions_total", gate="governance", outcome="policy") == 1
    assert _sample(reg, "ftl_gate_denials_total", gate="policy", reason="policy_denied") == 1
    assert reg.get_sample_value("ftl_gate_denials_total", {"gate": "nonsense", "reason": "x"}) is None
    m.count_gate_denial("approval", "made_up_kind")  # unknown kinds fail closed
    assert _sample(reg, "ftl_gate_denials_total", gate="approval", reason="internal_error") == 1
