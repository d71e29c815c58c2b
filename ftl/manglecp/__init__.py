"""MangleCP (protocol draft ``2026-02-draft``): wire messages, server framework, transports, client.

Independent of ftl's own tools: ``ftl.server`` builds ftl's embedded server on top of this package.
The names below load on first access (PEP 562), so importing one submodule (e.g. the messages in
the server process) does not import the others (the client's HTTP stack in particular).
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "ManglecpClient": "client",
    **dict.fromkeys(("PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "Fact", "IntentResponse", "InvokeResponse",
                     "MacroTool", "Manifest", "ProtocolError", "fact", "make_error", "parse_message",
                     "to_ftl_error"), "messages"),
    "apply_state_delta": "facts",
    **dict.fromkeys(("BearerAuth", "Principal", "Session"), "access"),
    **dict.fromkeys(("BoundContext", "InvocationOutcome", "ServerInfo", "ServerLimits", "Skill",
                     "ToolDefinition"), "definitions"),
    "ManglecpServer": "server",
    **dict.fromkeys(("HttpTransport", "InProcessTransport", "StdioTransport", "Transport"), "transport"),
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """The public name ``name`` from the submodule that defines it."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
