"""Executors: where a task's work runs, behind one small interface (`ftl.executors.base`).

* `local` (the default): a fixed pool of driver threads; each task's commands are processes on
  this machine (parent-death signals and the ledger of running groups: `ftl.processes`, on
  the ground floor, since the tool server and the transports use it too).
* `ray_cluster`: the same driver threads keep the protocol (store, event log, retries,
  integration); each task's build and verify run as one Ray task on any node of a cluster
  (optional dependency ``ftl-runner[ray]``); `remote_attempt` is what runs there.

The scheduler (`ftl.engine.scheduler`) talks only to `Executor`; the EXECUTE state picks the backend
(a `ray_cluster.RayCluster`'s executor when the run connected one, else a local one).
"""
