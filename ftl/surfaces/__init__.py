"""Surfaces: how ftl's results and errors look to each kind of caller.

``envelope`` (the response-v2 envelope of every CLI and tool result; ``envelope_model`` its
pydantic model, loaded only to validate), ``jsonrpc`` (JSON-RPC 2.0 errors for MCP clients),
``sanitize`` (what may leave ftl: no secrets, absolute paths or tracebacks) and ``errors_doc``
(docs/errors.md, generated from the registry in `ftl.errors`). All of them read the one error
registry; none of them decides anything about a campaign.
"""
