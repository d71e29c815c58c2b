"""HTML postmortem of a replayed run: one self-contained file, no network, no script.

`render_html(replay)` draws, from a `ftl.postmortem.replay.Replay` alone:

- a timeline: state bands above one Gantt lane per worker (task attempts coloured by outcome;
  when the run used several nodes, issue 14, the lanes are grouped under a header per node),
  failures, retries and recoveries marked where they happened, crash boundaries as red lines
  (a long dead gap between a crash and its resume is cut short and drawn as a break);
- the task DAG (layered left to right by dependency depth) with each task's final status;
- the cascade tree from each blocked root to the tasks it made unreachable;
- a table of failures with classification, what followed, and the registry's remediation
  (`ftl.errors.kind(error_type).remediation`);
- the attempts, states, runs, invariant violations and, when given, the decision diff.

The SVG is generated here in Python. The page carries a Content-Security-Policy that forbids
every fetch and every script, so opening it can never reach the network. All log text is
escaped: a log is data, never markup.
"""

from __future__ import annotations

import math
from itertools import islice
from datetime import datetime
from html import escape
from typing import Any, Callable, Iterable, Sequence

from ftl.errors import kind
from ftl.postmortem.diff import DecisionDiff
from ftl.postmortem.text import format_ms
from ftl.postmortem.timeline import Failure, Replay, TaskAttempt, TaskInfo, node_sort_key

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STATE_COLORS = {
    "INIT": "#94a3b8", "EXPLORE": "#60a5fa", "PLAN": "#a78bfa", "REGISTER": "#818cf8",
    "EXECUTE": "#34d399", "BUILD": "#2dd4bf", "CASCADE": "#fbbf24", "OBSERVE": "#22d3ee",
    "COMPLETE": "#4ade80", "ERROR": "#f87171",
}
# (fill, stroke) per task outcome
STATUS_COLORS = {
    "complete": ("#bbf7d0", "#15803d"), "blocked": ("#fecaca", "#b91c1c"),
    "cascade": ("#fff1f2", "#e11d48"), "pending": ("#e5e7eb", "#6b7280"),
    "cancelled": ("#e5e7eb", "#6b7280"), "interrupted": ("#fed7aa", "#c2410c"),
    "running": ("#fde68a", "#a16207"),
}
OUTCOME_COLORS = {"complete": "#15803d", "complete_with_blocked": "#b45309", "returned": "#b91c1c",
                  "cancelled": "#6b7280"}

_CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
       color: #111827; background: #f9fafb; }
main { max-width: 1320px; margin: 0 auto; padding: 20px 28px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.sub { color: #4b5563; margin: 0 0 12px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { background: #fff; border: 1px solid #e5e7eb; border-radius: 8px; padding: 8px 12px; flex: 1 1 84px; }
.card b { display: block; font-size: 18px; } .card span { color: #6b7280; font-size: 12px; }
.box { background: #fff; border: 1px solid #e5e7eb; border-radius: 8px; padding: 10px 14px; margin: 8px 0; }
.ok { border-left: 5px solid #16a34a; } .bad { border-left: 5px solid #dc2626; }
.warn { border-left: 5px solid #d97706; }
.scroll { overflow-x: auto; background: #fff; border: 1px solid #e5e7eb; border-radius: 8px; }
table { border-collapse: collapse; width: 100%; background: #fff; font-size: 13px; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid #f1f5f9; vertical-align: top;
         white-space: nowrap; }
th { background: #f3f4f6; font-weight: 600; position: sticky; top: 0; }
td.msg { max-width: 360px; overflow-wrap: anywhere; color: #374151; white-space: normal; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; }
.pill { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 12px; border: 1px solid; }
ul.tree, ul.tree ul { list-style: none; margin: 0; padding-left: 18px; }
ul.tree li { position: relative; padding: 2px 0; }
ul.tree ul li::before { content: "\\2514\\2500"; position: absolute; left: -16px; color: #9ca3af; }
.legend { display: flex; flex-wrap: wrap; gap: 12px; font-size: 12px; color: #374151; margin: 6px 0; }
.sw { display: inline-block; width: 12px; height: 12px; border-radius: 2px; vertical-align: -2px;
      margin-right: 4px; border: 1px solid #6b7280; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
"""


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _epoch_ms(ts: Any) -> float | None:
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000.0
    except ValueError:
        return None


def _fmt_ms(ms: float | None) -> str:
    return format_ms(ms, digits=2)


def _status_key(info: TaskInfo) -> str:
    if info.status == "blocked" and info.blocked_by:
        return "cascade"
    return info.status if info.status in STATUS_COLORS else "pending"


def _attempt_key(attempt: TaskAttempt) -> str:
    if attempt.status is None:
        return "interrupted"
    return attempt.status if attempt.status in STATUS_COLORS else "pending"


# ---------------------------------------------------------------------------------- time axis

class _TimeAxis:
    """Maps timestamps to x. Long dead gaps between a crash and its resume are shortened to
    ``break_ms`` of drawn time so that the work on both sides stays readable."""

    def __init__(self, result: Replay, x0: float, width: float) -> None:
        self.t0 = _epoch_ms(result.first_ts) or 0.0
        t_end = _epoch_ms(result.last_ts) or self.t0
        self.cuts: list[tuple[float, float]] = []  # (gap start, removed ms), in time order
        total = max(1.0, t_end - self.t0)
        for prev, nxt in zip(result.runs, result.runs[1:]):
            start, end = _epoch_ms(prev.last_ts), _epoch_ms(nxt.start)
            if start is None or end is None:
                continue
            gap = end - start
            if gap > max(2000.0, 0.08 * total):
                self.cuts.append((start, gap))
        removed = sum(gap for _, gap in self.cuts)
        active = max(1.0, total - removed)
        self.break_ms = 0.04 * active if self.cuts else 0.0
        self.span_ms = active + self.break_ms * len(self.cuts)
        self.x0, self.width = x0, width
        self.scale = width / self.span_ms

    def drawn_ms(self, t: float) -> float:
        shift = 0.0
        for start, gap in self.cuts:
            if t >= start + gap:
                shift += gap - self.break_ms
            elif t > start:
                shift += (t - start) * (1 - self.break_ms / gap)
        return t - self.t0 - shift

    def x(self, ts: Any) -> float | None:
        t = _epoch_ms(ts)
        if t is None:
            return None
        return self.x0 + max(0.0, min(self.span_ms, self.drawn_ms(t))) * self.scale

    def breaks(self) -> list[float]:
        return [self.x0 + self.drawn_ms(start) * self.scale for start, _ in self.cuts]

    def ticks(self) -> list[tuple[float, str]]:
        """Tick marks at a 1-2-5 step of drawn time (labels are elapsed time since the start)."""
        target = self.span_ms / 8
        step = 10 ** math.floor(math.log10(max(target, 1)))
        for factor in (1, 2, 5, 10):
            if step * factor >= target:
                step *= factor
                break
        ticks, t = [], 0.0
        while t <= self.span_ms + 1e-6:
            ticks.append((self.x0 + t * self.scale, _fmt_ms(t) if t else "0"))
            t += step
        return ticks


# ---------------------------------------------------------------------------------- timeline

def _lane_key(result: Replay) -> Callable[[TaskAttempt], Any]:
    """An attempt's timeline lane: its worker; ``(node, worker)`` when the run used several
    nodes (issue 14), as two nodes may both have a worker ``pid 1234``."""
    if result.multi_node:
        return lambda attempt: (attempt.node or "?", attempt.worker or "?")
    return lambda attempt: attempt.worker or "?"


def _lane_order(lanes: set[Any]) -> list[Any]:
    """Workers by name length then name (w2 before w10); ``(node, worker)`` lanes grouped by
    node, the driver first and an unknown node (``?``) last."""
    def worker(name: str) -> tuple[int, str]:
        return (len(name), name)

    def key(lane: Any) -> Any:
        if isinstance(lane, tuple):
            node, name = lane
            return (*node_sort_key(node), worker(name))
        return worker(lane)
    return sorted(lanes, key=key)



def _timeline_svg(result: Replay) -> str:
    label_w, width, right = 96.0, 1120.0, 16.0
    axis = _TimeAxis(result, label_w, width)
    lane_of = _lane_key(result)
    workers = _lane_order({lane_of(a) for a in result.attempts})
    by_task: dict[str, list[TaskAttempt]] = {}
    for attempt in result.attempts:
        by_task.setdefault(attempt.seq, []).append(attempt)
    campaign_marks = [f for f in result.failures if not f.task_seq] + \
        [r for r in result.recoveries if not r.get("task_seq")]
    lanes: list[Any] = (["campaign"] if campaign_marks or not workers else []) + workers
    state_y, state_h = 22.0, 24.0
    lane_y0, lane_h, header_h = state_y + state_h + 14, 26.0, 22.0
    # Each lane's top; a node's header row comes before its first lane (several nodes only).
    lane_top: dict[Any, float] = {}
    headers: list[tuple[str, float]] = []
    y = lane_y0
    for lane in lanes:
        if isinstance(lane, tuple) and (not headers or headers[-1][0] != lane[0]):
            headers.append((lane[0], y))
            y += header_h
        lane_top[lane] = y
        y += lane_h
    height = y + 30
    first_top = lane_top[lanes[0]]
    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="timeline" '
        f'width="{label_w + width + right:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {label_w + width + right:.0f} {height:.0f}">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fed7aa"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#c2410c" stroke-width="2"/></pattern></defs>',
        f'<text x="4" y="{state_y + 16:.0f}" font-size="12" fill="#374151">states</text>',
    ]
    for node, y in headers:
        count = result.nodes.get(node)
        tip = f"node {node}" + (f": {count} attempt{'' if count == 1 else 's'} in the log" if count else "")
        parts.append(f'<g class="node"><title>{_e(tip)}</title><rect x="0" y="{y:.0f}" '
                     f'width="{label_w + width:.0f}" height="{header_h:.0f}" fill="#e5e7eb"/>'
                     f'<text x="4" y="{y + 15:.0f}" font-size="12" font-weight="600" fill="#111827">'
                     f'node {_e(node)}</text></g>')
    for i, lane in enumerate(lanes):
        y = lane_top[lane]
        fill = "#f9fafb" if i % 2 == 0 else "#ffffff"
        label, indent = (lane[1], 12) if isinstance(lane, tuple) else (lane, 4)
        parts.append(f'<rect x="{label_w:.0f}" y="{y:.0f}" width="{width:.0f}" height="{lane_h:.0f}" fill="{fill}"/>')
        parts.append(f'<text x="{indent}" y="{y + 17:.0f}" font-size="12" fill="#374151">{_e(label)}</text>')
    for tick_x, label in axis.ticks():
        parts.append(f'<line x1="{tick_x:.1f}" y1="{state_y - 4:.0f}" x2="{tick_x:.1f}" '
                     f'y2="{height - 22:.0f}" stroke="#e5e7eb"/>')
        parts.append(f'<text x="{tick_x:.1f}" y="{height - 8:.0f}" font-size="11" fill="#6b7280" '
                     f'text-anchor="middle">{_e(label)}</text>')
    # State bands.
    for span in result.states:
        x1 = axis.x(span.start)
        x2 = axis.x(span.end) if span.end else axis.x(result.last_ts)
        if x1 is None or x2 is None:
            continue
        w = max(1.5, x2 - x1)
        color = STATE_COLORS.get(span.state, "#cbd5e1")
        tip = f"{span.state} (seq {span.seq}) {_fmt_ms(span.duration_ms)}"
        if span.error_type:
            tip += f" error_type={span.error_type}"
        if span.trigger:
            tip += f" -> {span.to} ({span.trigger})"
        parts.append(f'<g><title>{_e(tip)}</title><rect x="{x1:.1f}" y="{state_y:.0f}" width="{w:.1f}" '
                     f'height="{state_h:.0f}" rx="3" fill="{color}" stroke="#ffffff"/>')
        if w > 8 * len(span.state) * 0.75:
            parts.append(f'<text x="{x1 + w / 2:.1f}" y="{state_y + 16:.0f}" font-size="11" '
                         f'text-anchor="middle" fill="#111827">{_e(span.state)}</text>')
        parts.append("</g>")
    # Attempts.
    for attempt in result.attempts:
        x1 = axis.x(attempt.start)
        end = attempt.end
        if end is None:
            run = result.runs[attempt.run] if 0 <= attempt.run < len(result.runs) else None
            end = run.last_ts if run is not None else result.last_ts
        x2 = axis.x(end)
        if x1 is None or x2 is None:
            continue
        y = lane_top.get(lane_of(attempt), first_top) + 4
        key = _attempt_key(attempt)
        fill, stroke = STATUS_COLORS[key]
        fill = "url(#hatch)" if key == "interrupted" else fill
        w = max(2.0, x2 - x1)
        where = f"{attempt.worker} (node {attempt.node or '?'})" if result.multi_node else attempt.worker
        tip = (f"task {attempt.seq} attempt {attempt.attempt} on {where}: "
               f"{attempt.status or 'interrupted by a crash'} ({_fmt_ms(attempt.duration_ms)})")
        if attempt.error_type:
            tip += f" {attempt.error_type}"
        if attempt.retries:
            tip += f", {attempt.retries} retr{'y' if attempt.retries == 1 else 'ies'}"
        parts.append(f'<g><title>{_e(tip)}</title><rect x="{x1:.1f}" y="{y:.0f}" width="{w:.1f}" '
                     f'height="{lane_h - 8:.0f}" rx="3" fill="{fill}" stroke="{stroke}"/>')
        if w >= 26:
            parts.append(f'<text x="{x1 + 4:.1f}" y="{y + 13:.0f}" font-size="11" fill="#111827">'
                         f'{_e(attempt.seq)}</text>')
        parts.append("</g>")

    def lane_y(task: str | None, seq: int | None) -> float:
        lane: Any = "campaign"
        for attempt in by_task.get(task or "", []):
            if seq is not None and attempt.start_seq is not None and attempt.start_seq <= seq and (
                    attempt.end_seq is None or seq <= attempt.end_seq):
                lane = lane_of(attempt)
        return lane_top.get(lane, first_top) + lane_h / 2

    for failure in result.failures:
        x = axis.x(failure.ts)
        if x is None:
            continue
        y = lane_y(failure.task_seq, failure.seq)
        tip = (f"TOOL_FAILURE seq {failure.seq}: {failure.tool} {failure.error_type} "
               f"[{failure.klass or 'unclassified'} -> {failure.decision or '-'}]"
               + (f" {failure.outcome}" if failure.outcome else ""))
        parts.append(f'<g><title>{_e(tip)}</title><circle cx="{x:.1f}" cy="{y:.1f}" r="6" fill="#dc2626" '
                     f'stroke="#ffffff"/><path d="M{x - 3:.1f},{y - 3:.1f} L{x + 3:.1f},{y + 3:.1f} '
                     f'M{x + 3:.1f},{y - 3:.1f} L{x - 3:.1f},{y + 3:.1f}" stroke="#ffffff" '
                     f'stroke-width="1.6"/></g>')
    for retry in result.retries:
        x = axis.x(retry.get("ts"))
        if x is None:
            continue
        y = lane_y(retry.get("task_seq"), retry.get("seq")) - 1
        tip = (f"RETRY seq {retry.get('seq')}: {retry.get('tool')} attempt {retry.get('attempt')} "
               f"after {retry.get('wait_ms')} ms ({retry.get('error_type')})")
        parts.append(f'<g><title>{_e(tip)}</title><path d="M{x + 4:.1f},{y - 7:.1f} l7,7 l-7,7 z" '
                     f'fill="#f59e0b" stroke="#ffffff"/></g>')
    for recovery in result.recoveries:
        x = axis.x(recovery.get("ts"))
        if x is None:
            continue
        y = lane_y(recovery.get("task_seq"), recovery.get("seq"))
        tip = f"RECOVERY_ATTEMPT seq {recovery.get('seq')}: {recovery.get('strategy')} success={recovery.get('success')}"
        color = "#2563eb" if recovery.get("success") else "#7c3aed"
        parts.append(f'<g><title>{_e(tip)}</title><path d="M{x:.1f},{y - 7:.1f} l6,7 l-6,7 l-6,-7 z" '
                     f'fill="{color}" stroke="#ffffff"/></g>')
    # Crash boundaries and shortened gaps.
    for prev, nxt in zip(result.runs, result.runs[1:]):
        x = axis.x(prev.last_ts)
        if x is None:
            continue
        label = "crash" if prev.crashed else str(prev.outcome)
        color = "#dc2626" if prev.crashed else "#6b7280"
        tip = (f"{'crash' if prev.crashed else prev.outcome} after seq {prev.last_seq} in "
               f"{prev.interrupted_state or '-'}; resumed at seq {nxt.start_seq}"
               + (f"; tasks in flight: {', '.join(prev.interrupted_tasks)}" if prev.interrupted_tasks else ""))
        parts.append(f'<g><title>{_e(tip)}</title><line x1="{x:.1f}" y1="{state_y - 8:.0f}" x2="{x:.1f}" '
                     f'y2="{height - 22:.0f}" stroke="{color}" stroke-width="2" stroke-dasharray="5,3"/>'
                     f'<text x="{x + 3:.1f}" y="{state_y - 10:.0f}" font-size="11" fill="{color}" '
                     f'font-weight="600">{_e(label)} / resume</text></g>')
    for x in axis.breaks():
        parts.append(f'<g><title>idle time between the crash and the resume, shortened</title>'
                     f'<path d="M{x + 2:.1f},{state_y - 2:.0f} l4,5 l-4,5 l4,5" fill="none" '
                     f'stroke="#6b7280"/></g>')
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------- DAG

def _layers(tasks: Sequence[TaskInfo]) -> dict[str, int]:
    """Longest-path layer of each task (0 for tasks without known dependencies); cycles and
    unknown dependencies are ignored (the plan was validated before it ran)."""
    known = {t.seq: t for t in tasks}
    layer: dict[str, int] = {}
    for start in known:
        stack = [(start, False)]
        visiting: set[str] = set()
        while stack:
            seq, expanded = stack.pop()
            if seq in layer:
                continue
            deps = [d for d in (known[seq].depends or []) if d in known]
            if expanded:
                visiting.discard(seq)
                layer[seq] = 1 + max((layer.get(d, 0) for d in deps), default=-1)
                continue
            visiting.add(seq)
            stack.append((seq, True))
            stack.extend((d, False) for d in deps if d not in layer and d not in visiting)
    return layer


def _dag_svg(result: Replay) -> str:
    tasks = result.ordered_tasks()
    if not tasks:
        return '<p class="sub">No tasks were registered in this log.</p>'
    have_edges = any(t.depends for t in tasks)
    layer = _layers(tasks) if have_edges else {t.seq: 0 for t in tasks}
    columns: dict[int, list[TaskInfo]] = {}
    for task in tasks:
        columns.setdefault(layer.get(task.seq, 0), []).append(task)
    node_w, node_h, col_gap, row_gap, pad = 178.0, 42.0, 60.0, 14.0, 16.0
    if not have_edges:  # no graph in the log: wrap the tasks in a grid
        per_col = max(1, math.ceil(math.sqrt(len(tasks) * 2)))
        columns = {i: tasks[i * per_col:(i + 1) * per_col] for i in range(math.ceil(len(tasks) / per_col))}
    position: dict[str, tuple[float, float]] = {}
    order: dict[str, float] = {}
    for col in sorted(columns):
        items = columns[col]
        if col > 0 and have_edges:  # barycentre of the parents' rows, to cut crossings
            def centre(t: TaskInfo) -> float:
                rows = [order[d] for d in (t.depends or []) if d in order]
                return sum(rows) / len(rows) if rows else float("inf")
            items = sorted(items, key=lambda t: (centre(t), int(t.seq) if t.seq.isdigit() else 0))
        for row, task in enumerate(items):
            order[task.seq] = row
            position[task.seq] = (pad + col * (node_w + col_gap), pad + row * (node_h + row_gap))
    width = pad * 2 + (max(columns) + 1) * (node_w + col_gap) - col_gap
    height = pad * 2 + max(len(items) for items in columns.values()) * (node_h + row_gap) - row_gap
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="task DAG" '
             f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#9ca3af"/>'
             '</marker><marker id="arrow-red" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#e11d48"/>'
             '</marker></defs>']
    for task in tasks:
        for dep in task.depends or []:
            if dep not in position or task.seq not in position:
                continue
            (x1, y1), (x2, y2) = position[dep], position[task.seq]
            sx, sy, ex, ey = x1 + node_w, y1 + node_h / 2, x2 - 2, y2 + node_h / 2
            blocked = task.status == "blocked" and bool(task.blocked_by)
            stroke, marker = ("#e11d48", "arrow-red") if blocked else ("#9ca3af", "arrow")
            dash = ' stroke-dasharray="5,3"' if blocked else ""
            mid = (sx + ex) / 2
            parts.append(f'<path d="M{sx:.1f},{sy:.1f} C{mid:.1f},{sy:.1f} {mid:.1f},{ey:.1f} {ex:.1f},{ey:.1f}" '
                         f'fill="none" stroke="{stroke}" stroke-width="1.4"{dash} marker-end="url(#{marker})"/>')
    for task in tasks:
        x, y = position[task.seq]
        key = _status_key(task)
        fill, stroke = STATUS_COLORS[key]
        dash = ' stroke-dasharray="4,3"' if key == "cascade" else ""
        slug = task.slug or ""
        slug = slug if len(slug) <= 19 else slug[:18] + "\u2026"
        detail = "blocked" if task.status == "blocked" else task.status
        if task.blocked_by:
            detail = f"blocked by {', '.join(task.blocked_by)}"
        elif task.error_type:
            detail += f": {task.error_type}"
        if task.attempts > 1:
            detail += f" \u00b7 {task.attempts} attempts"
        detail = detail if len(detail) <= 27 else detail[:26] + "\u2026"
        tip = f"{task.seq} {task.slug or ''}: {task.status}"
        if task.reason:
            tip += f"\n{task.reason}"
        parts.append(f'<g><title>{_e(tip)}</title><rect x="{x:.1f}" y="{y:.1f}" width="{node_w:.0f}" '
                     f'height="{node_h:.0f}" rx="6" fill="{fill}" stroke="{stroke}" stroke-width="1.5"{dash}/>'
                     f'<text x="{x + 8:.1f}" y="{y + 17:.1f}" font-size="12" font-weight="600" fill="#111827">'
                     f'{_e(task.seq)} <tspan font-weight="400">{_e(slug)}</tspan></text>'
                     f'<text x="{x + 8:.1f}" y="{y + 33:.1f}" font-size="11" fill="{stroke}">{_e(detail)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------------------------- cascade

def _cascade_html(result: Replay) -> str:
    blocks = result.blocks()
    if not blocks:
        return '<p class="sub">No task was blocked.</p>'
    tasks = result.tasks
    items: list[str] = []
    for block in blocks:
        root = block["root"]
        cause = block["error_type"] or "blocked"
        reason = (block["reason"] or "").splitlines()[0] if block["reason"] else ""
        fill, stroke = STATUS_COLORS["blocked"]
        head = (f'<span class="pill" style="background:{fill};border-color:{stroke}">{_e(root)}</span> '
                f'<b>{_e(block["slug"] or "")}</b> \u2014 root cause <code>{_e(cause)}</code>'
                + (f": {_e(reason)}" if reason else ""))
        members = set(block["blocked"])
        seen: set[str] = set()

        def children(seq: str) -> list[str]:
            found = [t for t in block["blocked"] if seq in (tasks[t].depends or [])]
            if not any(tasks[t].depends for t in block["blocked"]) and seq == root:
                found = list(block["blocked"])  # no graph in the log: one level
            return found

        def subtree(seq: str, depth: int) -> str:
            out = []
            for child in children(seq):
                if child in seen:
                    out.append(f"<li>{_e(child)} <span class=\"sub\">(also under another branch)</span></li>")
                    continue
                seen.add(child)
                info = tasks[child]
                out.append(f'<li><span class="pill" style="background:{STATUS_COLORS["cascade"][0]};'
                           f'border-color:{STATUS_COLORS["cascade"][1]}">{_e(child)}</span> '
                           f'{_e(info.slug or "")} <span class="sub">unreachable</span>'
                           f'{subtree(child, depth + 1) if depth < 50 else ""}</li>')
            return f"<ul>{''.join(out)}</ul>" if out else ""

        body = subtree(root, 0)
        rest = sorted(members - seen - {root})
        if rest:
            body += "<ul>" + "".join(f"<li>{_e(s)} {_e(tasks[s].slug or '')}</li>" for s in rest) + "</ul>"
        items.append(f"<li>{head}{body}</li>")
    return f'<ul class="tree">{"".join(items)}</ul>'


# ---------------------------------------------------------------------------------- tables

def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], empty: str) -> str:
    body = ["<tr>" + "".join(f"<td>{cell}</td>" if not cell.startswith("<td") else cell for cell in row)
            + "</tr>" for row in rows]
    if not body:
        return f'<p class="sub">{_e(empty)}</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _offset(result: Replay, ts: Any) -> str:
    t0, t = _epoch_ms(result.first_ts), _epoch_ms(ts)
    return "-" if t0 is None or t is None else f"+{_fmt_ms(t - t0)}"


def _followed(failure: Failure) -> str:
    outcome = failure.outcome or ""
    if outcome == "retried":
        return f"retried (seq {failure.outcome_seq})"
    if outcome.startswith("recovered:"):
        return f"in-state recovery <code>{_e(outcome.split(':', 1)[1])}</code> (seq {failure.outcome_seq})"
    if outcome.startswith("failed:"):
        return f"recovery <code>{_e(outcome.split(':', 1)[1])}</code> failed (seq {failure.outcome_seq})"
    if outcome == "error":
        return f"went to ERROR (seq {failure.outcome_seq})"
    if outcome == "interrupted":
        return "cut by a crash"
    return _e(failure.decision or "-")


def _failures_table(result: Replay) -> str:
    rows = []
    for f in result.failures:
        remediation = kind(f.error_type or "internal_error").remediation
        rows.append([
            _e(f.seq), _e(_offset(result, f.ts)), _e(f.state), _e(f.task_seq or "-"),
            f"<code>{_e(f.tool)}</code> #{_e(f.attempt or 1)}", f"<code>{_e(f.error_type)}</code>",
            f"{_e(f.klass or 'unclassified')} \u2192 {_e(f.decision or '-')}", _followed(f),
            f'<td class="msg">{_e(f.message)}</td>', f'<td class="msg">{_e(remediation)}</td>',
        ])
    return _table(["seq", "at", "state", "task", "tool #attempt", "error_type", "class \u2192 decision",
                   "what followed", "message", "remediation"], rows, "No tool failed.")


def _attempts_table(result: Replay) -> str:
    failures = {f.seq: f for f in result.failures}
    many_nodes = result.multi_node
    rows = []
    for a in result.attempts:
        key = _attempt_key(a)
        fill, stroke = STATUS_COLORS[key]
        errors = ", ".join(f"{failures[s].error_type} (seq {s})" for s in a.failures or () if s in failures)
        slug = result.tasks[a.seq].slug if a.seq in result.tasks else ""
        rows.append([
            f"<b>{_e(a.seq)}</b> {_e(slug)}", _e(a.attempt),
            *([_e(a.node or "?")] if many_nodes else []), _e(a.worker), _e(a.run),
            _e(_offset(result, a.start)), _e(_fmt_ms(a.duration_ms)),
            f'<span class="pill" style="background:{fill};border-color:{stroke}">'
            f'{_e(a.status or "interrupted")}</span>' + (f" <code>{_e(a.error_type)}</code>" if a.error_type else ""),
            _e(a.retries), _e(", ".join(a.recoveries or ()) or "-"),
            _e("-" if a.cost_usd is None else f"${a.cost_usd:.4f}"
               + (f" · {a.num_turns} turns" if a.num_turns else "")),
            _commit_cell(result, a),
            f'<td class="msg">{_e(errors or "-")}</td>',
        ])
    return _table(["task", "attempt", *(["node"] if many_nodes else []), "worker", "run", "start", "duration", "outcome", "retries",
                   "recoveries", "cost", "commit (integration #)", "failures (every attempt's)"],
                  rows, "No task was started.")


def _commit_cell(result: Replay, attempt: Any) -> str:
    """The attempt's task commit (worktree isolation) and its place in the integration order."""
    if not attempt.commit:
        return "-"
    info = result.tasks[attempt.seq] if attempt.seq in result.tasks else None
    order = f" (#{info.integrated})" if info is not None and info.integrated else ""
    return f"<code>{_e(attempt.commit[:12])}</code>{_e(order)}"


def _states_table(result: Replay) -> str:
    rows = []
    for s in result.states:
        color = STATE_COLORS.get(s.state, "#cbd5e1")
        left = f"{_e(s.trigger)} \u2192 {_e(s.to)}" if s.trigger else ("cut by crash" if s.interrupted else "end")
        rows.append([_e(s.seq), f'<span class="sw" style="background:{color}"></span>{_e(s.state)}'
                     + (" <i>(resumed)</i>" if s.resumed else ""), _e(s.run), _e(_offset(result, s.start)),
                     _e(_fmt_ms(s.duration_ms)), left, _e(s.error_type or "")])
    return _table(["seq", "state", "run", "entered", "duration", "left by", "error_type"], rows,
                  "No state was entered.")


def _runs_table(result: Replay) -> str:
    rows = []
    for r in result.runs:
        outcome = r.outcome or "crashed"
        color = "#dc2626" if r.crashed else OUTCOME_COLORS.get(outcome, "#374151")
        rows.append([_e(r.index), "resume" if r.resume else "start", _e(r.file), _e(r.start_seq),
                     _e(r.end_seq or r.last_seq), f'<b style="color:{color}">{_e(outcome)}</b>',
                     _e(r.exit_code if r.exit_code is not None else "-"),
                     _e(r.interrupted_state or "-"), _e(", ".join(r.interrupted_tasks) or "-")])
    return _table(["run", "kind", "file", "first seq", "last seq", "ended", "exit", "cut in state",
                   "tasks in flight"], rows, "No RUN_START in the log.")


def _diff_html(diff: DecisionDiff, against: Sequence[str]) -> str:
    name = ", ".join(against) or "the other run"
    if diff.same:
        return (f'<div class="box ok">Same decisions as {_e(name)} ({diff.a_count} decisions; '
                'timestamps, durations, workers and op ids ignored).</div>')
    rows = []
    first = diff.first()
    for d in [first] + [x for x in diff.lanes if x is not first]:
        def side(decision: Any) -> str:
            return "(no more decisions)" if decision is None else f"seq {decision.seq}: <code>{_e(decision.describe())}</code>"
        context = "<br>".join(f"seq {c.seq}: <code>{_e(c.describe())}</code>" for c in d.context) or "-"
        rows.append([("<b>first</b> " if d is first else "") + _e(d.lane), _e(d.index + 1),
                     f'<td class="msg">{context}</td>', side(d.a), side(d.b)])
    return (f'<div class="box warn">Decisions differ from {_e(name)} in {len(diff.lanes)} lane(s).</div>'
            + _table(["lane", "decision #", "before (same in both)", "this run", _e(name)], rows, ""))


# ---------------------------------------------------------------------------------- page

def _legend() -> str:
    states = "".join(f'<span><span class="sw" style="background:{c}"></span>{s}</span>'
                     for s, c in STATE_COLORS.items())
    outcomes = "".join(f'<span><span class="sw" style="background:{f};border-color:{s}"></span>{k}</span>'
                       for k, (f, s) in STATUS_COLORS.items() if k not in ("running",))
    marks = ('<span><b style="color:#dc2626">\u2716</b> TOOL_FAILURE</span>'
             '<span><b style="color:#f59e0b">\u25b6</b> RETRY</span>'
             '<span><b style="color:#2563eb">\u25c6</b> RECOVERY_ATTEMPT</span>'
             '<span><b style="color:#dc2626">\u2506</b> crash / resume</span>')
    return f'<div class="legend">{states}</div><div class="legend">{outcomes}{marks}</div>'


class _DrawnTasks(dict):  # type: ignore[type-arg]
    """The first ``limit`` tasks, in order (what the DAG draws); a look-up of any other task
    (a blocked dependent in the cascade, an attempt's slug) reads the run's task table."""

    def __init__(self, result: Replay, limit: int) -> None:
        super().__init__((t.seq, t) for t in islice(result.tasks.values(), limit))
        self._table = result.tasks

    def __missing__(self, seq: str) -> TaskInfo:
        info = self._table.peek(seq)
        if info is None:
            raise KeyError(seq)
        return info

    def __contains__(self, seq: object) -> bool:
        return dict.__contains__(self, seq) or (isinstance(seq, str) and self._table.peek(seq) is not None)

    def get(self, seq: str, default: Any = None) -> Any:  # type: ignore[override]
        return self[seq] if seq in self else default


class _Drawn:
    """What the report draws of a run: the first ``limit`` of each list (states, attempts,
    tasks, failures, retries, recoveries, cascade roots), read from the spool; every other
    attribute is the run's. A run of a million events would otherwise make a page of hundreds
    of MB that no browser opens; the cards keep the run's real totals."""

    def __init__(self, result: Replay, limit: int) -> None:
        self._result = result
        self.limit = limit
        self.states = list(islice(result.states, limit))
        self.attempts = list(islice(result.attempts, limit))
        self.failures = list(islice(result.failures, limit))
        self.retries = list(islice(result.retries, limit))
        self.recoveries = list(islice(result.recoveries, limit))
        self.tasks = _DrawnTasks(result, limit)
        self._blocks = list(islice(result.iter_blocks(), limit))
        self.cut = {name: total for name, total in (
            ("states", len(result.states)), ("task attempts", len(result.attempts)),
            ("tasks", len(result.tasks)), ("failures", len(result.failures)),
            ("retries", len(result.retries)), ("recoveries", len(result.recoveries)),
            ("invariant violations", len(result.violations)),
            ("cascade roots", sum(1 for _ in result.tasks.cascade())))
            if total > limit}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)

    def ordered_tasks(self) -> list[TaskInfo]:
        return list(self.tasks.values())

    def blocks(self) -> list[dict[str, Any]]:
        return self._blocks


def render_html(result: Replay, *, diff: DecisionDiff | None = None, against: Sequence[str] = (),
                title: str | None = None, limit: int = 2000) -> str:
    """The postmortem as one HTML document (UTF-8 text; no external resource, no script).

    Args:
        result: a `ftl.postmortem.replay.replay` result.
        diff: a decision diff against another run (`ftl.postmortem.replay.diff_decisions`), shown when given.
        against: the other run's file names, for the diff's labels.
        title: page title (default ``ftl postmortem <campaign_id>``).
        limit: at most this many of each list are drawn (the cards count them all, and a note
            says what was left out: the text and JSON postmortems list everything).
    """
    title = title or f"ftl postmortem {result.campaign_id or ''}".strip()
    outcome = result.outcome or "unfinished"
    color = OUTCOME_COLORS.get(outcome, "#b91c1c")
    counts: dict[str, int] = {}
    for info in result.tasks.values():
        counts[info.status] = counts.get(info.status, 0) + 1
    crashes = len(result.crash_boundaries)
    cards = [
        (f'<b style="color:{color}">{_e(outcome)}</b>', "outcome"),
        (f"<b>{_e(result.exit_code if result.exit_code is not None else '-')}</b>", "exit code"),
        (f"<b>{_e(_fmt_ms(result.duration_ms))}</b>", "wall time"),
        (f"<b>{_e(counts.get('complete', 0))} / {_e(len(result.tasks))}</b>", "tasks complete"),
        (f"<b>{_e(counts.get('blocked', 0))}</b>", "tasks blocked"),
        (f"<b>{_e(len(result.failures))}</b>", "failures"),
        (f"<b>{_e(len(result.retries))}</b>", "retries"),
        (f"<b>{_e(crashes)}</b>", "crashes resumed"),
        (f"<b>{_e(result.events)}</b>", "events"),
    ]
    if result.agent_cost_usd or result.agent_tokens:
        cards.insert(5, (f"<b>${result.agent_cost_usd:.4f}</b>", "agent cost (total)"))
    card_html = "".join(f'<div class="card">{v}<span>{_e(k)}</span></div>' for v, k in cards)
    notes = "".join(f"<li>{_e(n)}</li>" for n in result.warnings())
    warn_html = f'<div class="box warn"><b>Log warnings</b><ul>{notes}</ul></div>' if notes else ""
    if result.violations:
        rows = "".join(f"<li>seq {_e(v.seq)}: <code>{_e(v.rule)}</code> {_e(v.message)}</li>"
                       for v in islice(result.violations, limit))
        check_html = (f'<div class="box bad"><b>{len(result.violations)} invariant violation(s)</b>'
                      f"<ul>{rows}</ul></div>")
    else:
        check_html = '<div class="box ok"><b>Invariants: all hold</b> (design.md \u00a76).</div>'
    summary = result.summary or {}
    summary_html = (f'<p class="sub">Returned: {_e(summary.get("message"))}</p>'
                    if summary.get("message") else "")
    diff_html = f"<h2>Decision diff</h2>{_diff_html(diff, against)}" if diff is not None else ""
    files = ", ".join(result.files)
    drawn = _Drawn(result, limit)
    if drawn.cut:
        cut = ", ".join(f"{name} ({total:,})" for name, total in drawn.cut.items())
        warn_html += (f'<div class="box warn"><b>A large run</b>: the report draws the first '
                      f"{limit:,} of {_e(cut)}. <code>ftl replay LOG</code> (text) and "
                      "<code>--format json</code> list everything.</div>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>{_e(title)}</h1>"
        f'<p class="sub">{_e(result.objective or "")}</p>'
        f'<p class="sub">Log: <code>{_e(files)}</code> \u00b7 flow {_e(result.flow)} \u00b7 '
        f"{_e(result.first_ts)} \u2192 {_e(result.last_ts)}</p>"
        f'<div class="cards">{card_html}</div>{summary_html}{check_html}{warn_html}'
        f"<h2>Timeline</h2>{_legend()}<div class=\"scroll\">{_timeline_svg(drawn)}</div>"
        f'<h2>Task DAG (final status)</h2><div class="scroll">{_dag_svg(drawn)}</div>'
        f"<h2>Cascade</h2>{_cascade_html(drawn)}"
        f"<h2>Failures</h2>{_failures_table(drawn)}"
        f"<h2>Task attempts</h2>{_attempts_table(drawn)}"
        f"<h2>States</h2>{_states_table(drawn)}"
        f"<h2>Runs</h2>{_runs_table(result)}"
        f"{diff_html}"
        "</main></body></html>\n"
    )
