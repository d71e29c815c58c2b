"""Tests for ftl.postmortem.html: the HTML report of the real failure drill logs (clean, and killed
then resumed), escaping of hostile log text, the time axis with a long crash gap, the DAG
layout on generated graphs, and a render in headless Chromium that must log no console message
(a CSP violation, a failed load, a script error) and lay out every SVG with real geometry."""

from __future__ import annotations

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
from ftl.postmortem.replay import Replay, TaskInfo, diff_decisions, replay

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
