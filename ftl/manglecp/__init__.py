"""MangleCP (protocol draft ``2026-02-draft``): wire messages, server framework, transports, client.

Independent of ftl's own tools: ``ftl.server`` builds ftl's embedded server on top of this package.
"""

from ftl.manglecp.client import ManglecpClient
from ftl.manglecp.messages import (
    PROTOCOL_VERSION, SUPPORTED_VERSIONS, Fact, IntentResponse, InvokeResponse, MacroTool, Manifest,
    ProtocolError, apply_state_delta, fact, make_error, parse_message, to_ftl_error)
from ftl.manglecp.server import (
    BearerAuth, BoundContext, InvocationOutcome, ManglecpServer, Principal, ServerInfo, ServerLimits,
    Session, Skill, ToolDefinition)
from ftl.manglecp.transport import HttpTransport, InProcessTransport, StdioTransport, Transport

__all__ = [
    "PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "Fact", "IntentResponse", "InvokeResponse", "MacroTool",
    "Manifest", "ProtocolError", "apply_state_delta", "fact", "make_error", "parse_message",
    "to_ftl_error", "BearerAuth", "BoundContext", "InvocationOutcome", "ManglecpServer", "Principal",
    "ServerInfo", "ServerLimits", "Session", "Skill", "ToolDefinition", "HttpTransport",
    "InProcessTransport", "StdioTransport", "Transport", "ManglecpClient",
]
