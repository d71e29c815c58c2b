"""One module per state of the campaign machine (installed as ``ftl.states``).

Each module's ``enter(run)`` says what happens on entry and returns the trigger to fire next
(`ftl.engine.runner.Next`) or the end of the run (`ftl.engine.runner.Finish`). Handlers never fire triggers
themselves, so a failure can always move the machine to ERROR before anything else moves.
"""

from ftl.engine.machine import State
from ftl.states import build, cascade, complete, error, execute, explore, init, observe, plan, register

HANDLERS = {
    State.INIT: init.enter,
    State.EXPLORE: explore.enter,
    State.PLAN: plan.enter,
    State.REGISTER: register.enter,
    State.EXECUTE: execute.enter,
    State.BUILD: build.enter,
    State.CASCADE: cascade.enter,
    State.OBSERVE: observe.enter,
    State.COMPLETE: complete.enter,
    State.ERROR: error.enter,
}

__all__ = ["HANDLERS"]
