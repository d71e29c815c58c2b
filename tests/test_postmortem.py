"""Tests for ftl.postmortem.html: the HTML report of the real failure drill logs (clean, and killed
then resumed), escaping of hostile log text, the time axis with a long crash gap, the DAG
layout on generated graphs, where tasks ran (issue 14: lanes grouped by node in the HTML, the
node in the text and JSON, old logs without nodes unchanged), and a render in headless Chromium
that must log no console message (a CSP violation, a failed load, a script error) and lay out
every SVG with real geometry."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftl.errors import kind
from ftl.postmortem.html import CSP, _layers, _TimeAxis, render_html
from ftl.postmortem.replay import Replay, TaskInfo, diff_decisions, render_text, replay, write_json

LOGS = Path(__file__).parent / "logs"
DRILL = LOGS / "drill.jsonl"
CRASH = LOGS / "drill_crash_resume.jsonl"
CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
INSTALL = "apt-get update && apt-get install -y chromium"


def _html(*paths: Path, **kwargs) -> str:
    return render_html(replay(list(paths)), **kwargs)


def test_the_drill_report_has_every_section_and_no_way_out() -> None:
    page = _html(DRILL)
    for heading in ("Timeline", "Task DAG (final status)", "Cascade", "Failures", "Task attempts",
                    "States", "Runs"):
        assert f"<h2>{heading}</h2>" in page
    assert f'content="{CSP}"' in page and "<script" not in page.lower()
    # Nothing to fetch: the only URL is the SVG namespace, which is a name, not a request.
    urls = set(re.findall(r"https?://[^\s\"'<>]+", page))
    assert urls == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?!#)""", page)
    assert page.count("<svg") == 2


def test_the_drill_report_shows_statuses_failures_and_remediation() -> None:
    page = _html(DRILL)
    for seq, slug in (("001", "unit-tests-flaky"), ("002", "yaml-export"), ("004", "bundle-reports")):
        assert f"{seq} <tspan font-weight=\"400\">{slug}</tspan>" in page  # a DAG node each
    assert "blocked by 002" in page and "blocked: dependency_missing" in page
    assert kind("dependency_missing").remediation in page  # from the one registry
    assert kind("flaky_test").remediation in page
    retry = next(f for f in replay([DRILL]).failures if f.outcome == "retried")
    assert f"retried (seq {retry.outcome_seq})" in page
    assert "in-state recovery <code>block_task</code>" in page
    assert "Invariants: all hold" in page and ">complete_with_blocked<" in page


def test_the_cascade_tree_follows_the_dependencies() -> None:
    page = _html(DRILL)
    tree = page[page.index('<ul class="tree">'):page.index("<h2>Failures</h2>")]
    # 004 depends on 003, which depends on the root 002: 004 is nested under 003.
    assert tree.index("002") < tree.index("003") < tree.index("004")
    assert re.search(r"003</span> yaml-matches-json <span class=\"sub\">unreachable</span><ul><li>", tree)
    assert "root cause <code>dependency_missing</code>" in tree


def test_a_crash_and_its_resume_are_drawn() -> None:
    page = _html(CRASH)
    assert "crash / resume" in page and "url(#hatch)" in page  # interrupted attempts are hatched
    assert "tasks in flight: 001, 006" in page
    assert ">crashed<" in page and "cut by crash" in page
    assert "<b>1</b><span>crashes resumed</span>" in page


def test_log_text_is_escaped(tmp_path: Path) -> None:
    records = [json.loads(line) for line in DRILL.read_text().splitlines()]
    for record in records:
        if record["event"] == "TOOL_FAILURE":
            record["message"] = "<script>alert('x')</script> & <img src=x onerror=y>"
        if record["event"] == "PLAN_REGISTERED":
            record["slugs"]["002"] = "<b>bold</b>"
    path = tmp_path / "hostile.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    page = _html(path)
    assert "<script>" not in page and "<img src=x" not in page and "<b>bold</b>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;img" in page


def test_the_decision_diff_section() -> None:
    diff = diff_decisions([DRILL], [CRASH])
    page = _html(DRILL, diff=diff, against=[CRASH.name])
    assert "<h2>Decision diff</h2>" in page and "Decisions differ from drill_crash_resume.jsonl" in page
    same = _html(DRILL, diff=diff_decisions([DRILL], [DRILL]), against=[DRILL.name])
    assert "Same decisions as drill.jsonl" in same


def test_an_empty_or_broken_log_still_renders(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    page = _html(tmp_path / "empty.jsonl")
    assert "No tasks were registered in this log." in page and "invariant violation" in page
    (tmp_path / "torn.jsonl").write_text(DRILL.read_text()[:5000])
    assert "the last line was torn" in _html(tmp_path / "torn.jsonl")


def test_a_long_gap_before_the_resume_is_shortened(tmp_path: Path) -> None:
    from datetime import datetime, timedelta

    records = [json.loads(line) for line in CRASH.read_text().splitlines()]
    for record in records:  # the resume came four hours after the crash
        if record["seq"] >= 32:
            moved = datetime.fromisoformat(record["ts"].replace("Z", "+00:00")) + timedelta(hours=4)
            record["ts"] = moved.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    path = tmp_path / "late.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = replay([path])
    crashed, resumed = result.runs
    axis = _TimeAxis(result, 0.0, 1000.0)
    assert len(axis.cuts) == 1 and axis.x(crashed.start) == 0.0 and axis.x(result.last_ts) == 1000.0
    # Both sides of the gap keep almost all the width; the four hours are a sliver.
    gap = axis.x(resumed.start) - axis.x(crashed.last_ts)
    assert 0 < gap < 60
    assert "idle time between the crash and the resume, shortened" in render_html(result)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.lists(st.integers(0, n - 1), max_size=3), min_size=n, max_size=n))))
def test_dag_layers_put_every_task_right_of_its_dependencies(graph: tuple[int, list[list[int]]]) -> None:
    n, raw = graph
    seqs = [f"{i + 1:03d}" for i in range(n)]
    # Only lower seqs as dependencies: a DAG, as a validated plan is.
    tasks = [TaskInfo(seq, slug=f"t{seq}", depends=sorted({seqs[d] for d in deps if d < i}),
                      status="complete") for i, (seq, deps) in enumerate(zip(seqs, raw))]
    layer = _layers(tasks)
    assert set(layer) == set(seqs)
    for task in tasks:
        for dep in task.depends:
            assert layer[task.seq] > layer[dep]
    result = Replay()
    for task in tasks:
        result.tasks.add(task.seq, task)
    page = render_html(result)
    svg = page[page.index('aria-label="task DAG"'):]
    assert all(svg.count(f">{seq} <tspan") == 1 for seq in seqs)
    assert svg.count("marker-end=") == sum(len(t.depends) for t in tasks)


def test_a_large_run_draws_the_first_items_and_says_so(tmp_path: Path) -> None:
    """A run too large for a page draws the first ``limit`` of each list, counts everything in
    the cards, names what was left out, and still finds every blocked dependent's task."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
    from bench_replay import generate

    log = tmp_path / "big.jsonl"
    generate(log, 12_000, seed=5)
    with replay([log]) as result:
        attempts, tasks, failures = len(result.attempts), len(result.tasks), len(result.failures)
        blocked_roots = len(result.blocks())
        page = render_html(result, limit=40)
        full = render_html(result, limit=100_000)
    assert attempts > 1000 and failures > 200 and blocked_roots > 40
    assert "A large run" in page and f"task attempts ({attempts:,})" in page and "A large run" not in full
    assert f"cascade roots ({blocked_roots:,})" in page
    assert f"<b>{failures}</b><span>failures</span>" in page  # the cards count every failure
    assert page.count("<tspan font-weight=\"400\">") == 40 < tasks  # the DAG: 40 task nodes
    assert page.count(">dependency_missing (seq ") <= 40
    assert page.count("root cause <code>") == 40
    assert len(page) * 10 < len(full)


# --------------------------------------------------------------------------- where tasks ran

RAY_NODE = "3f2a9c1b0d4e"
# The drill's tasks placed on two nodes (issue 14): 005 and 006 on a Ray node whose worker w1
# shares its name with the driver's; 006's TASK_START does not know its node, its TASK_END does.
PLACEMENT = {"001": ("driver", "w1"), "002": ("driver", "w1"), "005": (RAY_NODE, "w1"),
             "006": (RAY_NODE, "w2")}


def _on_nodes(path: Path, placement: dict[str, tuple[str, str]] = PLACEMENT) -> Path:
    records = [json.loads(line) for line in DRILL.read_text(encoding="utf-8").splitlines()]
    for record in records:
        if record["event"] in ("TASK_START", "TASK_END") and record["task_seq"] in placement:
            node, worker = placement[record["task_seq"]]
            record["worker"] = worker
            if not (record["task_seq"] == "006" and record["event"] == "TASK_START"):
                record["node"] = node
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _timeline(page: str) -> str:
    return page[page.index('aria-label="timeline"'):page.index("</svg>")]


def _lane_rows(timeline: str) -> list[tuple[float, str]]:
    """(y, text) of every label in the timeline's label column, top to bottom: node headers and
    lanes (``node ...`` for a header)."""
    return sorted((float(y), text) for y, text in re.findall(
        r'<text x="(?:4|12)" y="([\d.]+)" font-size="12"[^>]*>([^<]+)</text>', timeline)
        if text != "states")


def _bars(timeline: str) -> dict[str, float]:
    """Top y of each attempt's bar, by task seq (each task here has one attempt)."""
    return {seq: float(y) for seq, y in re.findall(
        r'<title>task (\d+) attempt \d+ on [^<]*</title><rect x="[\d.]+" y="([\d.]+)"', timeline)}


def test_a_run_on_two_nodes_groups_the_lanes_by_node(tmp_path: Path) -> None:
    page = _html(_on_nodes(tmp_path / "two-nodes.jsonl"))
    timeline = _timeline(page)
    rows = _lane_rows(timeline)
    # The driver first; under each header its own workers (both nodes have a w1).
    assert [text for _, text in rows] == ["node driver", "w1", f"node {RAY_NODE}", "w1", "w2"]
    assert timeline.count('<g class="node">') == 2
    lanes = {(node, worker): y for node, (y, worker) in zip(
        ["driver", RAY_NODE, RAY_NODE], [rows[1], rows[3], rows[4]])}
    bars = _bars(timeline)
    assert set(bars) == set(PLACEMENT)
    for seq, (node, worker) in PLACEMENT.items():
        label_y = lanes[(node, worker)]  # a lane's label sits 17 px below its top, a bar 4 px
        assert bars[seq] == label_y - 13, (seq, node, worker)
    assert f"task 005 attempt 1 on w1 (node {RAY_NODE})" in timeline
    assert "task 006 attempt 1 on w2 (node 3f2a9c1b0d4e)" in timeline  # from its TASK_END
    attempts = page[page.index("<h2>Task attempts</h2>"):page.index("<h2>States</h2>")]
    assert "<th>node</th><th>worker</th>" in attempts and f"<td>{RAY_NODE}</td>" in attempts


def test_the_text_and_json_name_each_attempts_node(tmp_path: Path) -> None:
    with replay([_on_nodes(tmp_path / "two-nodes.jsonl")]) as result:
        text = render_text(result)
        handle = io.StringIO()
        write_json(result.to_json(lazy=True), handle)
    assert "nodes: driver (2 attempts), 3f2a9c1b0d4e (2 attempts)" in text
    assert "  001 attempt 1 on w1 (node driver): complete" in text
    assert f"  005 attempt 1 on w1 (node {RAY_NODE}): complete" in text
    assert f"  006 attempt 1 on w2 (node {RAY_NODE}): complete" in text
    data = json.loads(handle.getvalue())
    assert data["nodes"] == {"driver": 2, RAY_NODE: 2}
    where = {a["seq"]: (a["node"], a["worker"]) for a in data["tasks"]}
    assert where == PLACEMENT


def test_a_log_without_nodes_renders_as_before(tmp_path: Path) -> None:
    """An old log (no ``node``) and the same log with every task on one node draw the same
    page and the same text: one lane per worker, no node header, no node named."""
    old = replay([DRILL])
    drill_workers = {"001": "w1", "002": "w1", "005": "w2", "006": "w2"}
    one_node = replay([_on_nodes(tmp_path / "one-node.jsonl",
                                 {seq: ("driver", worker) for seq, worker in drill_workers.items()})])
    page, text = render_html(old), render_text(old)
    assert [text for _, text in _lane_rows(_timeline(page))] == ["w1", "w2"]
    assert '<g class="node">' not in page and "(node " not in page and "<th>node</th>" not in page
    assert "nodes:" not in text and "(node " not in text and " on w1: " in text
    assert old.to_json()["nodes"] == {} and {a["node"] for a in old.to_json()["tasks"]} == {None}
    with_node = render_html(one_node)
    assert with_node.replace(one_node.files[0], "drill.jsonl") == page
    assert render_text(one_node).replace(one_node.files[0], "drill.jsonl") == text
    assert one_node.to_json()["nodes"] == {"driver": 4}


# --------------------------------------------------------------------------- headless Chromium

_PROBE_HEAD = """<script>
window.__errors = [];
addEventListener('error', e => __errors.push('error: ' + (e.message || e.target && e.target.outerHTML)), true);
document.addEventListener('securitypolicyviolation', e => __errors.push('csp: ' + e.violatedDirective + ' ' + e.blockedURI));
const __ce = console.error; console.error = (...a) => { __errors.push('console: ' + a.join(' ')); __ce(...a); };
</script>"""
_PROBE_TAIL = """<script>
const svgs = [...document.querySelectorAll('svg')].map(s => {
  const b = s.getBBox(); return {label: s.getAttribute('aria-label'), w: b.width, h: b.height,
  shapes: s.querySelectorAll('rect,path,circle').length};
});
const out = document.createElement('pre'); out.id = '__probe';
out.textContent = JSON.stringify({errors: __errors, svgs: svgs, height: document.body.scrollHeight,
  rows: document.querySelectorAll('tbody tr').length});
document.body.appendChild(out);
</script>"""


def _chromium(tmp_path: Path, page: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-extensions",
         f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0", *extra,
         page.as_uri()], capture_output=True, text=True, timeout=90)


@pytest.mark.skipif(CHROMIUM is None, reason=f"chromium is not installed ({INSTALL})")
@pytest.mark.parametrize("log", [DRILL, CRASH], ids=["drill", "crash-resume"])
def test_the_report_renders_in_headless_chromium_without_console_messages(tmp_path: Path, log: Path) -> None:
    page = render_html(replay([log]))
    report = tmp_path / "report.html"
    report.write_text(page, encoding="utf-8")
    # 1. The report as shipped (strict CSP): any blocked load or error is a console line.
    shipped = _chromium(tmp_path, report, "--dump-dom")
    assert shipped.returncode == 0, shipped.stderr[-2000:]
    console = [line for line in shipped.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert "<h2>Task DAG (final status)</h2>" in shipped.stdout
    # 2. A copy with a probe (the CSP relaxed for inline scripts only) that records errors and
    #    measures every SVG after layout.
    probed = page.replace(CSP, CSP + "; script-src 'unsafe-inline'").replace("<title>", _PROBE_HEAD + "<title>", 1)
    probed = probed.replace("</main>", "</main>" + _PROBE_TAIL, 1)
    probe = tmp_path / "probe.html"
    probe.write_text(probed, encoding="utf-8")
    run = _chromium(tmp_path, probe, "--dump-dom")
    found = re.search(r'<pre id="__probe">(.*?)</pre>', run.stdout, re.S)
    assert found, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&")
                        .replace("&lt;", "<").replace("&gt;", ">"))
    assert result["errors"] == []
    assert [s["label"] for s in result["svgs"]] == ["timeline", "task DAG"]
    for svg in result["svgs"]:
        assert svg["w"] > 300 and svg["h"] > 50 and svg["shapes"] > 6, svg
    assert result["rows"] > 10 and result["height"] > 800


_NODE_PROBE = """<script>
const box = e => { const b = e.getBBox(); return {y: b.y, h: b.height}; };
const out = document.createElement('pre'); out.id = '__probe';
out.textContent = JSON.stringify({
  headers: [...document.querySelectorAll('svg[aria-label=timeline] g.node')].map(g =>
    ({text: g.querySelector('text').textContent, ...box(g)})),
  bars: [...document.querySelectorAll('svg[aria-label=timeline] g')].filter(g =>
    g.querySelector('title') && g.querySelector('title').textContent.startsWith('task ')).map(g =>
    ({title: g.querySelector('title').textContent, ...box(g.querySelector('rect'))}))});
document.body.appendChild(out);
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason=f"chromium is not installed ({INSTALL})")
def test_two_nodes_render_grouped_in_headless_chromium(tmp_path: Path) -> None:
    """Laid out by a browser: a header per node, and every attempt's bar below its own node's
    header and above the next one."""
    page = render_html(replay([_on_nodes(tmp_path / "two-nodes.jsonl")]))
    report = tmp_path / "report.html"
    report.write_text(page, encoding="utf-8")
    shipped = _chromium(tmp_path, report, "--dump-dom")
    assert shipped.returncode == 0, shipped.stderr[-2000:]
    assert [line for line in shipped.stderr.splitlines() if ":CONSOLE" in line] == []
    probed = page.replace(CSP, CSP + "; script-src 'unsafe-inline'").replace("</main>", "</main>" + _NODE_PROBE, 1)
    probe = tmp_path / "probe.html"
    probe.write_text(probed, encoding="utf-8")
    run = _chromium(tmp_path, probe, "--dump-dom")
    found = re.search(r'<pre id="__probe">(.*?)</pre>', run.stdout, re.S)
    assert found, run.stdout[-2000:] + run.stderr[-2000:]
    layout = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    headers = layout["headers"]
    assert [h["text"] for h in headers] == ["node driver", f"node {RAY_NODE}"]
    assert all(h["h"] > 10 for h in headers) and headers[0]["y"] < headers[1]["y"]
    assert len(layout["bars"]) == len(PLACEMENT)
    for bar in layout["bars"]:
        seq = bar["title"].split()[1]
        below = headers[0] if PLACEMENT[seq][0] == "driver" else headers[1]
        assert bar["y"] >= below["y"] + below["h"], bar
        if below is headers[0]:
            assert bar["y"] + bar["h"] <= headers[1]["y"], bar


def test_a_task_level_failure_has_no_try_number_in_the_text(tmp_path: Path) -> None:
    """A failure the build step raises itself (e.g. out-of-scope files) is not a tool try:
    its TOOL_FAILURE has no ``attempt``, and the text says none rather than ``attempt None``."""
    log = tmp_path / "no-try.jsonl"
    lines = DRILL.read_text().splitlines()
    failure = json.loads(lines[40])
    assert failure["event"] == "TOOL_FAILURE"
    del failure["attempt"]
    log.write_text("\n".join([*lines[:40], json.dumps(failure), *lines[41:]]) + "\n")
    with replay([log]) as result:
        text = render_text(result)
    assert "shell_builder: dependency_missing" in text and "attempt None" not in text
