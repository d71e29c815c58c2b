"""The engine: what runs a campaign once a surface has asked for one.

``runner`` (builds the machine, the scheduler and the tool client; resume), ``machine`` (the
transitions Machine: states, triggers, guards; the handlers live in ``ftl.states``),
``scheduler`` (dynamic DAG scheduling onto an executor), ``recovery`` (classification, retry
policies, RECOVERY_ATTEMPT), ``replan``, ``workspaces``, ``status``, ``tools`` (the runner's
MangleCP tool client) and ``intent`` (the facts of an intent request). Surfaces (``ftl.surfaces``,
``lib/``) call the engine; the engine never imports a surface (tests/test_layering.py).
"""
