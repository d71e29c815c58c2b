"""The four gates every tool invocation passes: visibility, governance, policy, approval.

Modelled on ThoughtGate's gate flow (``shared/reference/errors-and-gates.md`` §1): the gates run
in a fixed order and the first refusal decides (ThoughtGate EC-ERR-005).

1. **visibility** (``[gates.expose]``): a tool is exposed when its name matches an ``include``
   glob and no ``exclude`` glob. Hidden tools are never selected by evaluation
   (`Gatekeeper.visible`) and an invocation of one is refused with ``tool_not_exposed``.
2. **governance** (``[gates.governance]``): the first rule whose ``match`` (tool and source globs)
   fits the call gives the route; no match gives ``default``. ``forward`` runs the tool at once
   (skips 3 and 4); ``deny`` refuses (``governance_denied``); ``approve`` goes to 4 (skips 3);
   ``policy`` goes to 3.
3. **policy** (``[gates.policy]``): Cedar (cedarpy). Anything but a clean ``Allow`` refuses
   (``policy_denied``): ``Deny``, ``NoDecision`` and an ``Allow`` reached while some policy failed
   to evaluate (fail closed, reference §5 rule 1). An ``Allow`` goes on to 4 only when one of the
   determining permit policies carries the annotation ``@approval("required")``; otherwise the
   call runs. (ThoughtGate sends every permit to an approval workflow; ftl has one workflow and
   asks a human only where a policy says so.)
4. **approval** (``[gates.approval]``): an interactive prompt (only on a TTY), a command (the
   call JSON on stdin; exit 0 approves, 1 rejects, anything else rejects) or a decision file
   polled for the request id. Each request gets a new id, so a decision answers one request
   (ThoughtGate: one approval per request), never a later call however alike. Rejected -> ``approval_rejected``; no answer within ``timeout_s``
   -> ``on_timeout`` (``deny`` -> ``approval_timeout``, ``approve`` -> the call runs and the
   decision records ``system:timeout-auto-approve``); approval needed but no workflow usable ->
   ``approval_not_found``. ``approval_timeout`` is structural (`ftl.errors`): the recovery
   protocol does not retry the call, so an approver that never answers is asked once per task
   attempt, and the next attempt (resume, re-plan) asks again.

Cedar request: principal ``Agent::"<principal>"`` (the caller's identity, ``anonymous`` when
unauthenticated), one action ``Action::"invoke"`` for every tool (side effects travel in the
context instead of one action per effect, so one policy can weigh several effects), resource
``Tool::"<name>"``. The context always has ``seq`` and ``task_type`` (``""`` when the call is not
about a task), ``files`` (the task's delta and creates), ``dirs`` (every ancestor directory of
those files), ``side_effects`` and ``source``; keys the caller passes in ``call["context"]`` are
added (and win).

A refusal raises `FtlError` of the gate's kind with ``details = {"tool", "gate"}`` only: no rule
patterns, policy ids or reasons reach the caller (reference §1.7); they go to the ``ftl.gate``
log at WARNING.

Modules, dependencies pointing one way: ``config`` (the ``[gates]`` models) and ``call`` (a
call, its Cedar context, `GateDecision`) at the bottom; ``policy`` (gate 3, Cedar) and
``approval`` (gate 4's workflows: prompt, command, file) above them; ``gatekeeper``
(`Gatekeeper`, which runs the gates in order) on top. What they log goes to the one ``ftl.gate``
logger. The public names import from here.
"""

from ftl.gate.approval import TIMEOUT_APPROVER, PromptIO, TtyPrompt
from ftl.gate.call import DEFAULT_SOURCE, GateDecision
from ftl.gate.config import (
    ApprovalConfig, ExposeConfig, GatesConfig, GovernanceConfig, GovernanceRule, PolicyConfig,
    parse_gates,
)
from ftl.gate.gatekeeper import GATES, Gatekeeper, refusal_outcome
from ftl.gate.policy import CedarPolicies

__all__ = ["ApprovalConfig", "CedarPolicies", "DEFAULT_SOURCE", "ExposeConfig", "GATES", "GateDecision",
           "Gatekeeper", "GatesConfig", "GovernanceConfig", "GovernanceRule", "PolicyConfig", "PromptIO",
           "TIMEOUT_APPROVER", "TtyPrompt", "parse_gates", "refusal_outcome"]
