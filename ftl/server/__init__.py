"""ftl's embedded MangleCP server: the catalog of ftl's tools, the selection rules, the wiring.

Use `ftl.server.app.build_server`; `ftl.server.serve` runs it over stdio or HTTP.
"""
