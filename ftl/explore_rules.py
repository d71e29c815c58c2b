"""The explorer modes and the EXPLORE quorum rule, without pydantic.

One definition serves the engine (`states/explore.py`), the models (`ftl.models.ExplorerResult`
takes its ``mode`` from `ExplorerMode`) and FTL's scripts (``lib/_common.py``'s explorer progress,
``lib/_exploration.py``), which must not load pydantic to name four modes (issue 11 item 1:
``exploration.py --help`` took 310 ms, 3x its neighbours).
This module imports nothing of ftl's.

Rule source: FTL's EXPLORE pattern (``shared/reference/ftl-behaviour.md`` §4.5), enforced
where FTL only counted result rows (§8.2 item 5).
"""

from __future__ import annotations

import enum


# The four explorers of EXPLORE (FTL explorer contract §5.5). A comment, not a docstring: pydantic
# would put a docstring into the committed explorer_result schema as its description.
class ExplorerMode(str, enum.Enum):
    STRUCTURE = "structure"
    PATTERN = "pattern"
    MEMORY = "memory"
    DELTA = "delta"


#: The modes' values, in EXPLORE's order.
EXPLORER_MODES: tuple[str, ...] = tuple(mode.value for mode in ExplorerMode)
#: Modes that meet the quorum together, whatever the configured count.
CRITICAL_EXPLORER_MODES = frozenset({"structure", "delta"})
#: The defaults of `ftl.config.Config`'s ``explorer_quorum`` and ``explorer_timeout_s`` (s): a
#: repository without ftl.toml has them, and FTL's scripts read them here without the model.
DEFAULT_EXPLORER_QUORUM = 3
DEFAULT_EXPLORER_TIMEOUT_S = 300.0


def quorum_met(usable: set[str] | frozenset[str], quorum: int) -> bool:
    """The explorer quorum (enforced where FTL only counted result rows, FTL §4.5 / §8.2 item 5).

    Args:
        usable: distinct modes whose result status is ``ok`` or ``partial``.
        quorum: modes required (config ``explorer_quorum``, default 3 of 4).

    Returns:
        True with ``min(quorum, 4)`` usable modes, or with both structure and delta.
    """
    return len(usable) >= min(quorum, len(EXPLORER_MODES)) or CRITICAL_EXPLORER_MODES <= set(usable)
