"""Shared plumbing of ftl's FTL-compatible scripts (lib/campaign.py, workspace.py, plan.py,
exploration.py, orchestration.py): the click group with ``--repo``, the one-envelope output
rule, input parsing, and store-only helpers the scripts share.

Output contract (every script, every command):

* stdout carries exactly one JSON object, the response-v2 envelope of `ftl.surfaces.envelope`
  (``success``, ``data``, ``error``, ``meta.version == "response-v2"``), on one line. Only
  ``--help`` prints text.
* ``data`` carries FTL's payload shape (``shared/reference/ftl-behaviour.md`` §4): where FTL
  printed a JSON object, that object is ``data``; where FTL printed an array, ``data`` is
  ``{"items": [...]}`` (an envelope's data is always an object); where FTL printed ``null``,
  ``data`` is ``{}``. Keys ftl adds to FTL's objects are listed in each command's help.
* Failures are ``success: false`` envelopes rendered from the error registry (`ftl.errors`):
  ``data.error_code``, ``data.error_type``, ``data.details``, ``data.remediation``. Click's own
  usage errors (unknown option, missing argument, bad value) become ``schema_invalid``
  envelopes too. No traceback ever reaches stdout or stderr: an unexpected exception prints
  `ftl.surfaces.envelope.internal_failure` and its traceback goes to ``<repo>/.ftl/lib.log`` under the
  correlation id.

Exit codes: 0 success; 2 the request was refused (bad input, unknown campaign/seq/plan/
workspace, illegal status transition, conflict with the current state); 1 internal error or a
transient failure worth retrying (the store was locked for longer than its busy timeout);
130 interrupted. FTL exited 1 with a traceback for most of these (§4 conventions).

FTL output mode (``FTL_OUTPUT=ftl`` in the environment, or ``--output ftl`` before the command):
stdout carries exactly what FTL's script printed for the same call (the same JSON value with
FTL's indentation, ``null`` included), and failures exit as FTL's did: where FTL printed a JSON
error object, that object and its exit code; where FTL raised, a one-line ``Error: <message>``
on stderr (no traceback) and exit 1; usage errors exit 2 as argparse's did. One adapter
(`run`) does this for every command: a command returns its `Reply` with FTL's payload in
``Reply.ftl`` (when it differs from ``data``); ``docs/ftl-compat.md`` lists where ftl's payload
differs from FTL's on purpose.

Running a script: ``python lib/<script>.py [--repo DIR] [--output envelope|ftl] COMMAND ...``. The repository root
(the parent of ``lib/``) is put first on ``sys.path``, so the scripts use the ``ftl`` package
beside them whether or not it is installed.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import functools  # noqa: E402 - after the sys.path setup on purpose
import json  # noqa: E402
import re  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable, NoReturn  # noqa: E402

import os  # noqa: E402

import click  # noqa: E402

from ftl.surfaces import envelope  # noqa: E402
from ftl.surfaces.clickutil import freezing_at_exit, usage_error  # noqa: E402
from ftl.errors import FtlError  # noqa: E402
from ftl.engine.replan import replan_input  # noqa: E402,F401 - re-exported for the scripts
from ftl.explore_rules import (DEFAULT_EXPLORER_QUORUM, DEFAULT_EXPLORER_TIMEOUT_S,  # noqa: E402
                               EXPLORER_MODES, quorum_met)  # EXPLORER_MODES: the scripts import it from here

__all__ = [
    "EXIT_OK", "EXIT_INTERNAL", "EXIT_REFUSED", "EXIT_INTERRUPTED", "Reply", "Env", "script_group",
    "run", "wrap", "exit_code_for", "parse_json_text", "read_stdin_json", "parse_json_option",
    "violation", "no_active_campaign", "campaign_entry", "replan_input", "fingerprint",
    "parse_workspace_ref", "explorer_progress", "TASK_STATUS_ALIASES", "command", "FtlRefusal",
    "output_mode", "ftl_task", "ftl_seq_text", "ftl_depends", "ftl_status", "ftl_plan_task",
    "plan_input", "FTL_PLAN_RECORD_KEYS", "OUTPUT_OPTION", "EXIT_HELP", "PLAN_VERSION",
]

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_REFUSED = 2
EXIT_INTERRUPTED = 130

#: FTL's status names accepted on input, mapped to the store's (FTL in_progress = ftl running).
TASK_STATUS_ALIASES = {"in_progress": "running"}

#: The type of every ``--plan-id`` / ``--id`` option naming a plan version: 1 up to SQLite's
#: largest INTEGER (2**63 - 1), so a larger number is a usage error rather than an OverflowError
#: inside the store (FTL crashed with that traceback).
PLAN_VERSION = click.IntRange(min=1, max=2**63 - 1)


# --------------------------------------------------------------------------- logging
# Set up on first need, not at import: `logging` and what it imports cost about 4 ms of every
# cold start (issue 11 item 1), and the light commands (``command(..., light=True)``) use only
# modules that never log. Every other command, and every failure, sets it up first.

_LOG_REPOS: list[Path] = []  # the repository of each `Env`, whose .ftl/lib.log gets the records
_REPO_HANDLERS: list[Any] = []  # attached handlers, detached by `run` after the last record
_LOGGING: list[Any] = []  # [the "ftl.lib" logger] once `_logging` ran


def _logging() -> Any:
    """Route ftl's records to ``<repo>/.ftl/lib.log`` of each `Env` (WARNING and up), never to
    stderr, and return the ``ftl.lib`` logger. Idempotent; new `Env` repos attach on the next call."""
    import logging

    if not _LOGGING:
        logging.raiseExceptions = False  # a failing log handler must not print a trace on stderr
        # Without a handler, logging's last-resort handler would print records on stderr.
        logging.getLogger("ftl").addHandler(logging.NullHandler())
        _LOGGING.append(logging.getLogger("ftl.lib"))
    while _LOG_REPOS:
        handler = _repo_log_handler()(_LOG_REPOS.pop(0) / ".ftl" / "lib.log", delay=True, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        handler.setLevel(logging.WARNING)
        logging.getLogger("ftl").addHandler(handler)
        _REPO_HANDLERS.append(handler)
    return _LOGGING[0]


def _repo_log_handler() -> type:
    """The handler class of ``<repo>/.ftl/lib.log`` (defined here: logging is imported late)."""
    import logging

    class RepoLogHandler(logging.FileHandler):
        """``<repo>/.ftl/lib.log``, created on the first record only."""

        def _open(self):  # noqa: ANN202 - logging's own signature
            Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
            return super()._open()

    return RepoLogHandler


# --------------------------------------------------------------------------- output

_UNSET: Any = object()


@dataclass
class Reply:
    """A command's result: the envelope's ``data`` object, warnings, the exit code, and FTL's
    payload for the FTL output mode.

    ``ftl``: exactly the JSON value FTL printed for this call (any JSON value, ``None`` for
    ``null``), or a function of no arguments that returns it (built only in the FTL output
    mode: a view of thousands of tasks costs milliseconds); unset means `unwrap` (``data``). ``ftl_indent``: FTL's ``json.dumps`` indent (2)
    or None for FTL's one-line output.
    """

    data: dict[str, Any]
    warnings: list[envelope.Warning] = field(default_factory=list)
    exit_code: int = EXIT_OK
    ftl: Any = _UNSET
    ftl_indent: int | None = 2
    ftl_exit: int | None = None  # FTL's exit code when it differs from exit_code


class FtlRefusal(FtlError):
    """A refusal FTL reported as a printed JSON object (e.g. ``{"error": "Plan 9 not found"}``)
    with an exit code, rather than a traceback: the FTL output mode prints ``ftl_payload``
    and exits ``ftl_exit``; the envelope mode renders the error kind as usual."""

    def __init__(self, kind: str, details: dict[str, Any] | None = None, *, ftl_payload: Any = None,
                 ftl_exit: int = 1, ftl_indent: int | None = None, ftl_stderr: str | None = None,
                 message: str | None = None) -> None:
        super().__init__(kind, details or {}, message=message)
        self.ftl_payload, self.ftl_exit, self.ftl_indent = ftl_payload, ftl_exit, ftl_indent
        self.ftl_stderr = ftl_stderr  # FTL's stderr line instead of a JSON payload


def unwrap(data: dict[str, Any]) -> Any:
    """The inverse of `wrap`: ``{"items": [...]}`` -> the list, ``{"value": x}`` -> x, ``{}`` ->
    None; any other object as it is."""
    if not data:
        return None
    if set(data) == {"items"} and isinstance(data["items"], list):
        return data["items"]
    if set(data) == {"value"}:
        return data["value"]
    return data


OUTPUT_MODES = ("envelope", "ftl")


def output_mode(argv: list[str]) -> str:
    """``ftl`` or ``envelope``: ``--output X`` / ``--output=X`` (no FTL command has an option of
    that name), else the ``FTL_OUTPUT`` environment variable, else envelope. An unknown value
    means envelope (the option then refuses it with a schema_invalid envelope)."""
    mode = os.environ.get("FTL_OUTPUT", "").strip().lower() or "envelope"
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--output" and index + 1 < len(argv):
            mode = argv[index + 1].strip().lower()
            break
        if arg.startswith("--output="):
            mode = arg.split("=", 1)[1].strip().lower()
            break
    return mode if mode in OUTPUT_MODES else "envelope"


class FtlText(str):
    """An FTL payload FTL printed as plain text (e.g. ``benchmark.py report``), not as JSON."""


def _print_ftl(value: Any, indent: int | None) -> None:
    if isinstance(value, FtlText):
        sys.stdout.write(value + "\n" if value else "")  # FTL printed nothing for no lines
    else:
        sys.stdout.write(json.dumps(value, indent=indent, default=str) + "\n")
    sys.stdout.flush()


def wrap(value: Any) -> dict[str, Any]:
    """FTL payload -> envelope data: objects as they are, arrays as ``{"items": [...]}``,
    ``null`` as ``{}``, any other scalar as ``{"value": x}`` (see the module docstring)."""
    if value is None:
        return {}
    if isinstance(value, list):
        return {"items": value}
    if isinstance(value, dict):
        return value
    return {"value": value}


def exit_code_for(error: FtlError) -> int:
    """2 for a refused request; 1 for an internal error or a transient (retryable) failure."""
    if error.error_type == "internal_error" or error.transient:
        return EXIT_INTERNAL
    return EXIT_REFUSED


def _correlation_id() -> str:
    import uuid  # only on the failure path: a cold start imports what the command needs (issue 11)

    return uuid.uuid4().hex[:12]


def _print(payload: dict[str, Any]) -> None:
    """One envelope line on stdout. orjson writes it (a 10,000-task payload: 4 ms instead of
    20), with datetimes and dataclasses left to ``default=str`` as `json.dumps` does; json
    writes what orjson refuses (an int past 64 bits)."""
    import orjson

    try:
        text = orjson.dumps(payload, default=str, option=orjson.OPT_NON_STR_KEYS
                            | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS).decode()
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(payload, default=str)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def violation(path: str, message: str, fix: str) -> FtlError:
    """A one-violation ``schema_invalid`` error (``details.violations[0] = {path, message, fix}``)."""
    return FtlError("schema_invalid", {"count": 1, "violations": [
        {"path": path, "message": message, "fix": fix}]}, message=f"Invalid {path}: {message}.")


def _usage_error(exc: click.ClickException) -> FtlError:
    return usage_error(exc)


def run(group: click.Group, argv: list[str] | None = None) -> NoReturn:
    """Run ``group`` and exit: print one envelope, exit with the codes of the module docstring.

    Commands return a `Reply`. ``--help`` prints its text and exits 0.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if output_mode(args) == "ftl":
        _run_ftl(group, args)
    try:
        result = group.main(args=args, prog_name=Path(sys.argv[0]).name, standalone_mode=False)
    except FtlError as error:
        payload, code = envelope.failure(error), exit_code_for(error)
    except click.exceptions.Abort:
        payload, code = envelope.failure(FtlError("cancelled")), EXIT_INTERRUPTED
    except click.ClickException as exc:
        payload, code = envelope.failure(_usage_error(exc)), EXIT_REFUSED
    except Exception:  # noqa: BLE001 - fail closed: one envelope, the trace only in the log
        correlation_id = _correlation_id()
        _logging().exception("lib %s failed [%s]", Path(sys.argv[0]).name, correlation_id)
        payload, code = envelope.internal_failure(correlation_id), EXIT_INTERNAL
    else:
        if not isinstance(result, Reply):  # --help printed its text
            _detach_repo_logs()
            sys.exit(result if isinstance(result, int) else EXIT_OK)
        payload = envelope.success(result.data, warnings=result.warnings)
        code = result.exit_code
    _detach_repo_logs()
    _print(payload)
    sys.exit(code)


def script_entry(group: click.Group) -> NoReturn:
    """A script's ``__main__``: `run` ``group`` on ``sys.argv``, with the exit of
    `ftl.surfaces.clickutil.freezing_at_exit` (tests call `run` in their own process)."""
    freezing_at_exit(lambda: run(group))
    raise AssertionError("unreachable: run exits")


def _run_ftl(group: click.Group, args: list[str]) -> NoReturn:
    """The FTL output mode of `run` (see the module docstring): FTL's stdout and exit codes."""
    code = EXIT_OK
    try:
        result = group.main(args=args, prog_name=Path(sys.argv[0]).name, standalone_mode=False)
    except FtlRefusal as error:
        if error.ftl_stderr is not None:
            sys.stderr.write(error.ftl_stderr + "\n")
        else:
            _print_ftl(error.ftl_payload, error.ftl_indent)
        code = error.ftl_exit
    except FtlError as error:
        sys.stderr.write(f"Error: {error.message}\n")
        code = 1
    except click.exceptions.Abort:
        code = EXIT_INTERRUPTED
    except click.ClickException as exc:
        sys.stderr.write(f"usage error: {exc.format_message()}\n")
        code = 2  # argparse's exit code for a usage error
    except Exception:  # noqa: BLE001 - fail closed, the trace only in the log
        correlation_id = _correlation_id()
        _logging().exception("lib %s failed [%s]", Path(sys.argv[0]).name, correlation_id)
        sys.stderr.write(f"Error: internal error (correlation id {correlation_id})\n")
        code = 1
    else:
        if isinstance(result, Reply):
            ftl = unwrap(result.data) if result.ftl is _UNSET else result.ftl
            _print_ftl(ftl() if callable(ftl) else ftl, result.ftl_indent)
            code = result.exit_code if result.ftl_exit is None else result.ftl_exit
        else:
            code = result if isinstance(result, int) else EXIT_OK
    _detach_repo_logs()
    sys.exit(code)


# --------------------------------------------------------------------------- context

class Env:
    """What every command needs: the repository, its store and its configuration (lazily).

    Args:
        repo: the repository directory; its ``.ftl/`` holds the store and the event logs.

    Raises:
        FtlError(not_found): ``repo`` is not a directory.
    """

    def __init__(self, repo: Path) -> None:
        if not repo.is_dir():
            raise FtlError("not_found", {"what": "the repository directory given by --repo"},
                           message="The --repo directory does not exist.")
        self.repo = repo.resolve()
        self._store = None
        self._config = None
        _LOG_REPOS.append(self.repo)  # its lib.log is attached by `_logging`
        if _LOGGING:
            _logging()

    @property
    def store(self):
        """The `ftl.store.Store` of ``<repo>/.ftl/ftl.db`` (created on first use)."""
        if self._store is None:
            from ftl.store import Store

            self._store = Store.for_repo(self.repo)
        return self._store

    @property
    def config(self):
        """`ftl.config.Config` from ``<repo>/ftl.toml`` (defaults when absent)."""
        if self._config is None:
            from ftl.config import load_config

            self._config = load_config(None, self.repo)
        return self._config

    def explorer_settings(self) -> tuple[int, float]:
        """``(explorer_quorum, explorer_timeout_s)`` of the configuration: the defaults of
        `ftl.explore_rules` when the repository has no ftl.toml, without loading the config's
        model (pydantic: ``check-explorers`` took 291 ms instead of 99); `config`'s otherwise.

        Raises: FtlError(configuration_error) from `config` for an invalid ftl.toml.
        """
        if self._config is None and not (self.repo / "ftl.toml").exists():
            return DEFAULT_EXPLORER_QUORUM, DEFAULT_EXPLORER_TIMEOUT_S
        return self.config.explorer_quorum, self.config.explorer_timeout_s

    def active(self, required: bool = True) -> dict | None:
        """The active campaign dict, or None (``required=False``).

        Raises: FtlError(not_found) when ``required`` and no campaign is active.
        """
        campaign = self.store.active_campaign()
        if campaign is None and required:
            raise no_active_campaign()
        return campaign

    def campaign(self, campaign_id: str | None) -> dict | None:
        """``campaign_id``'s campaign, else the active one, else the newest of any status, else None.

        Raises: FtlError(not_found) for an unknown ``campaign_id``.
        """
        if campaign_id:
            return self.store.get_campaign(campaign_id)
        return self.store.active_campaign() or self.store.latest_campaign()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _detach_repo_logs() -> None:
    _LOG_REPOS.clear()
    while _REPO_HANDLERS:
        handler = _REPO_HANDLERS.pop()
        _LOGGING[0].manager.getLogger("ftl").removeHandler(handler)
        handler.close()


def no_active_campaign() -> FtlError:
    return FtlError("not_found", {"what": "active campaign"},
                    message="No campaign is active; start one with `campaign.py create OBJECTIVE`.")


OUTPUT_OPTION = click.option(
    "--output", type=click.Choice(OUTPUT_MODES), default=None,
    help="envelope (default) or ftl: print exactly what FTL's script printed (also FTL_OUTPUT=ftl).")


def script_group(name: str, help_text: str) -> click.Group:
    """A click group with the shared ``--repo DIR`` option; commands get the `Env` as ``ctx.obj``."""

    @click.group(name=name, help=help_text + "\n\n" + EXIT_HELP)
    @click.option("--repo", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
                  show_default=True, help="Repository whose .ftl/ holds the store and event logs.")
    @OUTPUT_OPTION
    @click.pass_context
    def group(ctx: click.Context, repo: Path, output: str | None) -> None:
        ctx.obj = Env(repo)
        ctx.call_on_close(ctx.obj.close)

    return group


EXIT_HELP = ("Every command prints one response-v2 JSON envelope on stdout; FTL's payload is its "
              "`data` (arrays as {\"items\": [...]}, null as {}). With --output ftl (or "
              "FTL_OUTPUT=ftl) it prints exactly FTL's output instead. Exit codes: 0 success, 2 refused "
              "(bad input, unknown campaign/seq/plan, illegal transition), 1 internal or transient "
              "error (retry). § numbers in the help refer to FTL's behaviour reference "
              "(shared/reference/ftl-behaviour.md).")


# --------------------------------------------------------------------------- input parsing

def parse_json_text(text: str, source: str) -> Any:
    """Parse JSON text; any problem is a ``schema_invalid`` error naming line and column.

    Raises:
        FtlError(schema_invalid): empty input, invalid JSON (violation ``{"path": "$", "line",
            "column", "message", "fix"}``, 1-based) or nesting too deep to read.
    """
    if not text.strip():
        raise violation("$", f"the {source} is empty", f"send one JSON value on the {source}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise FtlError("schema_invalid", {"count": 1, "violations": [{
            "path": "$", "line": exc.lineno, "column": exc.colno,
            "message": f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            "fix": "fix the JSON syntax at that position"}]},
            message=f"The {source} is not valid JSON (line {exc.lineno}, column {exc.colno}).") from None
    except RecursionError:
        raise violation("$", "JSON nested too deeply to read", "send less deeply nested JSON") from None
    except ValueError as exc:  # NaN / Infinity
        raise violation("$", str(exc), "use null or a finite number") from None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


_UTF8_BOM = b"\xef\xbb\xbf"
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_DIGITS = b"0" * 19  # the shortest integer orjson may not read exactly (below -2**63)
_NOT_READ = object()


def _orjson_value(data: bytes) -> Any:
    """``data`` parsed by orjson when that gives what `parse_json_text` would (a 1.2 MB plan:
    5 ms instead of 9-12), else `_NOT_READ`.

    orjson refuses what json refuses here and more (NaN, Infinity, 1e400, lone surrogates,
    invalid UTF-8, nesting past 1024 levels): those go to `parse_json_text` for its value or its
    error, with the same wording and position. The one value orjson changes is an integer
    outside 64 bits, which it reads as a float; such an integer has 19 digits or more, so text
    with a run of 19 digits anywhere goes to json too (digits become ``0`` in one C pass over
    the bytes, then one search: 1.5 ms on 1.2 MB, where a regex takes 11). One difference is
    left: valid JSON nested between json's limit (Python's recursion limit, about 970 levels
    here) and orjson's 1024 is read instead of refused as too deep.
    """
    body = data[3:] if data.startswith(_UTF8_BOM) else data
    if _NINETEEN_DIGITS in body.translate(_DIGITS_AS_ZERO):
        return _NOT_READ
    import orjson

    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return _NOT_READ


def read_stdin_json(source: str = "standard input") -> Any:
    """Read all of stdin as UTF-8 JSON (see `parse_json_text`; orjson reads it when it gives
    the same value, `_orjson_value`)."""
    data = sys.stdin.buffer.read()
    value = _orjson_value(data)
    if value is not _NOT_READ:
        return value
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise violation("$", f"the {source} is not UTF-8 text", "send UTF-8 JSON") from None
    return parse_json_text(text, source)


def parse_json_option(text: str, option: str, expect: type = dict) -> Any:
    """Parse an option's JSON value and check its type (object by default).

    Raises: FtlError(schema_invalid) naming the option.
    """
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise violation(option, f"is not valid JSON ({getattr(exc, 'msg', 'too deep')})",
                        f"pass a JSON {'object' if expect is dict else 'array'}") from None
    if not isinstance(value, expect):
        raise violation(option, f"must be a JSON {'object' if expect is dict else 'array'}",
                        f"pass a JSON {'object' if expect is dict else 'array'}")
    return value


_WS_ID_RE = re.compile(r"^([0-9]+)-([a-z0-9]+(?:-[a-z0-9]+)*)\Z")


def parse_workspace_ref(text: str) -> tuple[str, str | None]:
    """A workspace reference -> ``(seq, workspace_id or None)``.

    Accepted forms (FTL ID_OR_PATH, §4.2): ``001-slug`` (the seq is normalised, so ``1-slug``
    works; FTL compared strings); a virtual path ``.../001_slug_active.xml`` (contains "/" or
    ends in ``.xml``; the status suffix is ignored); or a bare seq ``001`` (the task's latest
    workspace).

    Raises: FtlError(schema_invalid) for anything else.
    """
    from ftl.models import normalize_seq  # pydantic: imported only where a seq is parsed

    raw = text.strip()
    fix = "use <seq>-<slug> (e.g. 001-add-parser), a seq, or a path ending in 001_add-parser_active.xml"
    try:
        if "/" in raw or raw.endswith(".xml"):
            stem = raw.rsplit("/", 1)[-1]
            stem = stem[:-4] if stem.endswith(".xml") else stem
            parts = stem.split("_")
            if len(parts) >= 2 and _WS_ID_RE.match(f"{parts[0]}-{parts[1]}"):
                seq = normalize_seq(parts[0])
                return seq, f"{seq}-{parts[1]}"
        elif raw.isascii() and raw.isdigit():
            return normalize_seq(raw), None
        else:
            match = _WS_ID_RE.match(raw)
            if match:
                seq = normalize_seq(match.group(1))
                return seq, f"{seq}-{match.group(2)}"
    except ValueError:
        pass
    raise violation("ID", f"{raw[:80]!r} is not a workspace reference", fix)


# --------------------------------------------------------------------------- shared views

def campaign_entry(store, campaign: dict) -> dict[str, Any]:
    """FTL's campaign object (``{id, objective, status, framework, created_at, tasks}``) plus
    ftl's ``campaign_id``, ``flow``, ``finished_at``, ``summary`` and ``counts``
    (``{pending, running, complete, blocked, total}``). ``tasks`` are the store's task dicts."""
    cid = campaign["campaign_id"]
    return {
        "id": cid, "campaign_id": cid, "objective": campaign["objective"],
        "status": campaign["status"], "flow": campaign["flow"], "framework": campaign["framework"],
        "created_at": campaign["created_at"], "finished_at": campaign["finished_at"],
        "summary": campaign["summary"], "tasks": store.tasks(cid), "counts": store.counts(cid),
    }


def fingerprint(store, campaign: dict) -> dict[str, Any]:
    """FTL's campaign fingerprint (§4.1 ``fingerprint``), computed from the store on demand:
    ``{framework ("none" when unset), task_count, task_types (sorted), delta_files (<= 20, from
    the campaign's newest exploration's delta candidates), objective_hash (md5 hex[:8]),
    objective_preview (<= 100 chars)}``. FTL read the newest exploration of any campaign."""
    cid = campaign["campaign_id"]
    rows = store.tasks(cid)
    exploration = store.exploration(cid) or {}
    delta = exploration.get("delta") if isinstance(exploration.get("delta"), dict) else {}
    files: list[str] = []
    for candidate in delta.get("candidates") or []:
        path = (candidate.get("path") or candidate.get("file")) if isinstance(candidate, dict) else None
        if isinstance(path, str) and path not in files:
            files.append(path)
    objective = campaign["objective"]
    import hashlib  # here, not at the top: most commands never hash (cold start, issue 11)

    return {
        "framework": campaign["framework"] or "none", "task_count": len(rows),
        "task_types": sorted({r["type"] for r in rows}), "delta_files": files[:20],
        "objective_hash": hashlib.md5(objective.encode("utf-8"), usedforsecurity=False).hexdigest()[:8],
        "objective_preview": objective[:100],
    }




def explorer_progress(results: list[dict], quorum: int) -> dict[str, Any]:
    """Explorer progress of one session from its result rows (``{mode, status, ...}``).

    The quorum rule of the EXPLORE state, where FTL only counted rows (§4.5, §8.2 item 5): a mode
    counts once, and only with an ``ok`` or ``partial`` result; the quorum is met by
    ``min(quorum, 4)`` such modes or by both structure and delta.

    Returns: ``{completed: [modes], failed: [modes with only error results], missing: [modes
    without a usable result], modes: {mode: "complete" | "error" | "pending"}, rows: n,
    quorum_required: k, quorum_met: bool}``.
    """
    usable = {r["mode"] for r in results if r.get("status") in ("ok", "partial")}
    seen = {r["mode"] for r in results}
    modes = {mode: "complete" if mode in usable else ("error" if mode in seen else "pending")
             for mode in EXPLORER_MODES}
    required = min(quorum, len(EXPLORER_MODES))
    return {
        "completed": [m for m in EXPLORER_MODES if m in usable],
        "failed": [m for m in EXPLORER_MODES if modes[m] == "error"],
        "missing": [m for m in EXPLORER_MODES if m not in usable],
        "modes": modes, "rows": len(results), "quorum_required": required,
        "quorum_met": quorum_met(usable, quorum),
    }


def command(group: click.Group, name: str, *, light: bool = False, bulk: bool = False,
            **kwargs: Any) -> Callable:
    """``@group.command(name)`` whose function receives the `Env` first.

    ``light=True``: the command uses only modules that never log (the store, the DAG, the
    envelope), so logging is not set up before it runs (cold start, issue 11 item 1); a failure
    still reaches ``.ftl/lib.log``. tests/test_cold_start.py keeps logging out of their imports.

    ``bulk=True``: the command builds one object per task of a plan (10,000 tasks: tens of
    thousands of dicts and lists, none in a reference cycle), so Python's cyclic garbage collector
    is off while it runs: reference counting frees all of it, and the collector would only
    re-scan it (5-20 ms per command on a 10,000-task plan, issue 11 item 4).
    """

    def decorate(func: Callable) -> Callable:
        run_func = func
        if bulk:
            @functools.wraps(func)
            def without_cyclic_gc(env: Env, *args: Any, **options: Any) -> Any:
                import gc

                enabled = gc.isenabled()
                gc.disable()
                try:
                    return func(env, *args, **options)
                finally:
                    if enabled:
                        gc.enable()

            run_func = without_cyclic_gc
        if light:
            return group.command(name, **kwargs)(click.pass_obj(run_func))

        @functools.wraps(func)
        def logged(env: Env, *args: Any, **options: Any) -> Any:
            _logging()
            return run_func(env, *args, **options)

        return group.command(name, **kwargs)(click.pass_obj(logged))

    return decorate


# --------------------------------------------------------------------------- FTL views

def ftl_status(status: str) -> str:
    """A store task status as FTL named it (running -> in_progress)."""
    return "in_progress" if status == "running" else status


def ftl_seq_text(seq: str) -> str:
    """A seq as FTL's cascade output named it: ``str(int(seq))`` (FTL normalised to int)."""
    try:
        return str(int(seq))
    except ValueError:
        return seq


def ftl_depends(depends: list[str]) -> Any:
    """A dependency list as an FTL plan writes it: [] -> "none", one seq -> that seq, else the list."""
    if not depends:
        return "none"
    return depends[0] if len(depends) == 1 else list(depends)


def ftl_task(row: dict) -> dict[str, Any]:
    """A store task row as FTL's campaign task entry: ``{seq, slug, type, depends, status}`` plus
    ``updated_at`` once the task left pending, ``blocked_by`` (FTL int-text seqs) when a block
    was propagated to it and ``revised_at`` once a re-plan merge changed it."""
    task: dict[str, Any] = {"seq": row["seq"], "slug": row["slug"], "type": row["type"],
                            "depends": ftl_depends(row["depends"] or []),
                            "status": ftl_status(row["status"])}
    if row["status"] != "pending" or row.get("revised_at"):
        task["updated_at"] = row.get("updated_at")
    if row["status"] == "blocked" and row.get("blocked_by"):
        task["blocked_by"] = [ftl_seq_text(s) for s in row["blocked_by"]]
    if row.get("revised_at"):
        task["revised_at"] = row["revised_at"]
    return task


#: Keys FTL's ``plan.py read`` adds around a plan (its database record), not plan fields: FTL's
#: REGISTER pipes that output into ``campaign.py add-tasks``, so they are dropped on input.
FTL_PLAN_RECORD_KEYS = ("id", "version", "status", "created_at")

#: Task fields FTL's planner writes, always shown in FTL's view of a plan task.
_FTL_TASK_KEYS = ("seq", "slug", "type", "delta", "verify", "budget", "depends")


def plan_input(raw: Any) -> Any:
    """A plan as sent on input, without FTL's plan-record keys (`FTL_PLAN_RECORD_KEYS`) and
    with ``campaign_id: null`` dropped (FTL's plan record for a plan written before a campaign)."""
    if not isinstance(raw, dict):
        return raw
    plan = {k: v for k, v in raw.items() if k not in FTL_PLAN_RECORD_KEYS}
    if plan.get("campaign_id") is None:
        plan.pop("campaign_id", None)
    return plan


def ftl_plan_task(task) -> dict[str, Any]:
    """A `ftl.models.Task` as FTL's plan shows it: the planner's keys, depends as the planner
    writes it, then every other field only when it is not its default, extras as given."""
    dumped = task.model_dump(mode="json", exclude_defaults=True)
    full = task.model_dump(mode="json")
    view = {k: full[k] for k in _FTL_TASK_KEYS}
    view["depends"] = ftl_depends(task.depends)
    view.update({k: v for k, v in dumped.items() if k not in view})
    return view
