"""The text postmortem: a `Replay` as lines for a terminal or a note, streamed record by record."""

from __future__ import annotations

from typing import Iterator

from ftl.postmortem.timeline import Replay, node_sort_key


def format_ms(ms: float | None, digits: int = 1) -> str:
    """A duration for people: ``-``, ``"950 ms"``, ``"1.2 s"`` (``digits`` decimals), ``"3.5 min"``."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 120_000:
        return f"{ms / 1000:.{digits}f} s"
    return f"{ms / 60000:.1f} min"


def render_text(result: Replay) -> str:
    """`text_lines` as one string (for small logs and tests; the CLI streams the lines)."""
    return "".join(text_lines(result))


def text_lines(result: Replay) -> Iterator[str]:
    """A plain-text postmortem for terminals and notes, one ``\n``-terminated line at a time:
    outcome, warnings, runs and crash boundaries, the nodes (when more than one), states with
    durations, every task attempt with its worker (and its node, when more than one) and its
    failures, the failures with their classification and fate, the cascade roots, and
    the violations. Lines are made as the spooled records are read: memory stays flat."""
    for line in _text_body(result):
        yield line + "\n"


def _text_body(r: Replay) -> Iterator[str]:
    yield (f"campaign {r.campaign_id}: {r.events} events, "
           f"outcome {r.outcome or 'none (the log stops mid-run)'} (exit {r.exit_code}), "
           f"{format_ms(r.duration_ms)}")
    if r.objective:
        yield f"objective: {r.objective}"
    for note in r.warnings():
        yield f"warning: {note}"
    if len(r.runs) > 1:
        yield "runs:"
        for run in r.runs:
            yield (f"  run {run.index} ({'resume' if run.resume else 'start'}) seq {run.start_seq}-"
                   f"{run.end_seq or run.last_seq}: {run.outcome or 'CRASHED'}")
    for prev, nxt in zip(r.runs, r.runs[1:]):
        if prev.crashed:
            tasks = ", ".join(prev.interrupted_tasks) or "none"
            yield (f"crash boundary before seq {nxt.start_seq} (the run was resumed): last event "
                   f"seq {prev.last_seq} in {prev.interrupted_state or '-'}, tasks in flight: {tasks}")
    many_nodes = r.multi_node
    if many_nodes:
        yield "nodes: " + ", ".join(f"{node} ({r.nodes[node]} attempt{'' if r.nodes[node] == 1 else 's'})"
                                    for node in sorted(r.nodes, key=node_sort_key))
    yield "states:"
    for s in r.states:
        extra = f" error_type={s.error_type}" if s.error_type else ""
        leave = f" -> {s.to} ({s.trigger})" if s.trigger else (" (cut by crash)" if s.interrupted else "")
        yield (f"  seq {s.seq!s:>5} {s.state:<9} {format_ms(s.duration_ms):>9}{leave}{extra}"
               + (" [resumed]" if s.resumed else ""))
    if r.attempts:
        yield "tasks:"
        for a in r.attempts:
            where = f"{a.worker} (node {a.node or '?'})" if many_nodes else a.worker
            line = f"  {a.seq} attempt {a.attempt} on {where}: {a.status or 'interrupted'} " \
                   f"({format_ms(a.duration_ms)})"
            if a.error_type:
                line += f" {a.error_type}"
            if a.retries:
                line += f", {a.retries} retr{'y' if a.retries == 1 else 'ies'}"
            if a.failures:
                line += f", failures at seq {', '.join(map(str, a.failures))}"
            if a.commit:
                line += f", commit {a.commit[:12]}"
            if a.cost_usd is not None:
                line += f", ${a.cost_usd:.4f}" + (f" ({a.num_turns} turns)" if a.num_turns else "")
            yield line
        if r.agent_cost_usd or r.agent_tokens:
            yield f"agent cost: ${r.agent_cost_usd:.4f} total, {r.agent_tokens} tokens"
    if r.integrations:
        yield "integration (in order):"
        for item in r.integrations:
            how = "fast-forward" if item["fast_forward"] else f"merge -> {str(item['head'])[:12]}"
            yield (f"  #{item['order']} seq {item['seq']} task {item['task_seq']} commit "
                   f"{str(item['commit'])[:12]} ({how})")
    if r.failures:
        yield "failures:"
        for f in r.failures:
            where = f"task {f.task_seq} " if f.task_seq else ""
            tried = f" attempt {f.attempt}" if f.attempt is not None else ""  # a task-level failure
            yield (f"  seq {f.seq} {f.state} {where}{f.tool}{tried}: {f.error_type} "
                   f"[{f.klass or 'unclassified'}] -> {f.decision or '-'}"
                   + (f", {f.outcome}" if f.outcome else ""))
    if r.retries:
        yield "retries:"
        for retry in r.retries:
            yield (f"  seq {retry['seq']} {retry['tool']} attempt {retry['attempt']} after "
                   f"{retry['wait_ms']} ms ({retry['error_type']})")
    if r.recoveries:
        yield "recoveries:"
        for rec in r.recoveries:
            task = f" task {rec['task_seq']}" if rec.get("task_seq") else ""
            yield f"  seq {rec['seq']} {rec['strategy']}{task} success={rec['success']}"
    for index, block in enumerate(r.iter_blocks()):
        if not index:
            yield "cascade:"
        cause = f"{block['error_type']}: {block['reason']}" if block["error_type"] else "blocked"
        cause = cause.splitlines()[0] if cause else cause
        yield f"  root {block['root']} ({cause})"
        if block["blocked"]:
            yield f"    blocks {', '.join(block['blocked'])}"
    if r.violations:
        yield f"violations ({len(r.violations)}):"
        for v in r.violations:
            yield f"  seq {v.seq}: [{v.rule}] {v.message}"
    else:
        yield "invariants: all hold"
