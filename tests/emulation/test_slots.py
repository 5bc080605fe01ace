"""Values built through their slots equal those their classes' constructors build."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulation.conntrack import ConntrackEntry
from emulation.netfilter import Outcome
from emulation.packet import Packet, unchecked_replace
from emulation.slots import maker


@given(
    sport=st.integers(min_value=0, max_value=65535),
    mark=st.integers(min_value=0, max_value=0xFFFFFFFF),
    syn=st.booleans(),
    iface=st.sampled_from([None, "eth0"]),
)
def test_a_packet_built_field_by_field_equals_the_constructors(
    sport: int, mark: int, syn: bool, iface: str | None
) -> None:
    """Packet's own __init__ (through the slots) and unchecked_replace agree with replace()."""
    p = Packet(src="10.0.0.1", dst="10.0.0.2", sport=sport, dport=80, mark=mark, syn=syn, in_interface=iface)
    q = unchecked_replace(p, src="10.0.0.3", dst="10.0.0.4", sport=1, dport=2, mark=3, out_interface="x")
    assert q == replace(p, src="10.0.0.3", dst="10.0.0.4", sport=1, dport=2, mark=3, out_interface="x")
    assert hash(q) == hash(replace(q))


def test_the_packet_constructor_still_validates_and_is_frozen() -> None:
    with pytest.raises(ValueError, match="sport=70000"):
        Packet(src="10.0.0.1", dst="10.0.0.2", sport=70000)
    with pytest.raises(ValueError, match="different IP families"):
        Packet(src="10.0.0.1", dst="fd00::1")
    p = Packet(src="10.0.0.1", dst="10.0.0.2")
    with pytest.raises(FrozenInstanceError):
        p.sport = 1  # type: ignore[misc]


def test_maker_builds_what_the_constructor_builds() -> None:
    p = Packet(src="10.0.0.1", dst="10.0.0.2")
    made = maker(Outcome)("ACCEPT", "local", None, p, "NEW", False, False, False, "why", False, ())
    assert made == Outcome(
        verdict="ACCEPT",
        delivery="local",
        out_interface=None,
        packet=p,
        ctstate="NEW",
        dnat=False,
        snat=False,
        masquerade=False,
        reason="why",
        uncertain=False,
    )
    flow = (4, 1, 2, 3, 4, "tcp")
    entry = maker(ConntrackEntry)(flow, flow, 0.0, 30.0, False, 7)
    assert entry == ConntrackEntry(original=flow, reply=flow, created_s=0.0, expires_s=30.0, mark=7)


def test_maker_refuses_a_class_without_slots() -> None:
    from dataclasses import dataclass

    @dataclass
    class Plain:
        x: int

    with pytest.raises(TypeError, match="no __slots__"):
        maker(Plain)
