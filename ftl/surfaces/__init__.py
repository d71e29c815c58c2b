"""Surfaces: the front doors of ftl and how its results and errors look to each kind of caller.

The front ends: ``cli`` (the ``ftl`` click CLI; ``clickutil`` its lazy command group and shared
options) and ``mcp_server`` (ftl served to MCP clients such as Claude Code). What they answer
with: ``envelope`` (the response-v2 envelope of every CLI and tool result; ``envelope_model`` its
pydantic model, loaded only to validate), ``jsonrpc`` (JSON-RPC 2.0 errors for MCP clients) and
``errors_doc`` (docs/errors.md, generated from the registry in `ftl.errors`); what may leave ftl
is decided by `ftl.sanitize` on the ground floor, since the event log scrubs with it too. The
renderers read the one error registry and decide nothing about a campaign; the front ends hand
campaigns to `ftl.engine`.
"""
