"""What happens to a packet, as enums: its verdict, where it went, its conntrack state.

Each is a :class:`enum.StrEnum`, so a member equals (and hashes like) the kernel's own word:
``Verdict.ACCEPT == "ACCEPT"``, ``Delivery.LOCAL == "local"``, ``CtState.NEW == "NEW"``.
Callers that compare an outcome with strings keep working, and JSON prints the word.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["CONTINUE", "RETURN", "CtState", "Delivery", "Verdict"]


class Verdict(StrEnum):
    """What the hooks decided for a packet (``NF_ACCEPT``, ``NF_DROP``, or a REJECT's drop)."""

    ACCEPT = "ACCEPT"
    DROP = "DROP"
    REJECT = "REJECT"


class Delivery(StrEnum):
    """Where an accepted packet went: to a socket on the node, out of an interface, or nowhere."""

    LOCAL = "local"
    FORWARD = "forward"
    NONE = "none"


class CtState(StrEnum):
    """A packet's conntrack state as ``-m conntrack --ctstate`` sees it (``xt_conntrack.c``)."""

    NEW = "NEW"
    ESTABLISHED = "ESTABLISHED"
    RELATED = "RELATED"
    INVALID = "INVALID"
    UNTRACKED = "UNTRACKED"


#: Results of a target that do not end the walk: go on with the next rule (``XT_CONTINUE``),
#: or back to the calling chain (``XT_RETURN``).
CONTINUE: Final = "CONTINUE"
RETURN: Final = "RETURN"
