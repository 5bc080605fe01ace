"""``-m conntrack`` and ``-m state``: the packet's conntrack state, tuples and direction.

Theory of operation
-------------------
The kernel's match is ``conntrack_mt`` in net/netfilter/xt_conntrack.c (revisions 1, 2 and 3 all
call it through ``conntrack_mt_v1/v2/v3``). It reads what ``nf_ct_get`` gives: an entry ``ct``
and ``ctinfo``, or ``ct == NULL``. Since "netfilter: kill the fake untracked conntrack objects"
(Linux 4.12) an untracked packet has no entry either: ``xt_ct_target`` stores
``nf_ct_set(skb, NULL, IP_CT_UNTRACKED)``. So a packet has no entry when it is INVALID (conntrack
found none or refused it; also the "RELATED without an entry" that ``nf_conntrack_attach``
gives an error about an untracked packet) or UNTRACKED, and also in raw, before the conntrack
hook has run (``skb->_nfct`` is 0 there: INVALID, or UNTRACKED once ``CT --notrack`` ran). An
ICMP error or RST that carries a refused packet's entry (RELATED) *has* one. The match is::

    if (ct) statebit = XT_CONNTRACK_STATE_BIT(ctinfo);
    else if (ctinfo == IP_CT_UNTRACKED) statebit = XT_CONNTRACK_STATE_UNTRACKED;
    else statebit = XT_CONNTRACK_STATE_INVALID;
    if (info->match_flags & XT_CONNTRACK_STATE) {
        if (ct != NULL) { /* IPS_SRC_NAT_BIT -> |= SNAT, IPS_DST_NAT_BIT -> |= DNAT */ }
        if (!!(state_mask & statebit) ^ !(info->invert_flags & XT_CONNTRACK_STATE))
            return false;
    }
    if (ct == NULL)
        return info->match_flags & XT_CONNTRACK_STATE;
    /* then, each only when given: --ctdir, --ctorigsrc, --ctorigdst, --ctreplsrc,
       --ctrepldst, --ctproto and the four ports (ct_proto_port_check_v3), --ctstatus,
       --ctexpire; each "return false" when (test ^ !invert) */
    return true;

Without an entry, then, only ``--ctstate`` is looked at: the match holds exactly when
``--ctstate`` is given and holds (its SNAT/DNAT bits never do, ``!`` works as usual), and every
other option is skipped, negated or not. ``-m conntrack --ctdir ORIGINAL`` or ``! --ctorigsrc
10.0.0.0/8`` alone never match an INVALID or UNTRACKED packet; ``--ctstate INVALID --ctdir
REPLY`` matches every INVALID one.

``--ctdir`` cannot be negated (libxt_conntrack's ``ctdir`` option has no ``XTOPT_INVERT``);
``REPLY`` is stored as the inversion of ``ORIGINAL`` (``O_CTDIR`` sets ``XT_CONNTRACK_DIRECTION``
in ``invert_flags``), which the kernel tests as ``(CTINFO2DIR(ctinfo) == IP_CT_DIR_ORIGINAL) ^
!(invert_flags & XT_CONNTRACK_DIRECTION)``. ``--ctproto``, ``--ctstatus`` and ``--ctexpire`` are
not modelled (a rule with them loads as an unknown match, see
:mod:`emulation.netfilter.matches.modules`), nor are templates (``CT --zone`` and the like, an
entry ``ct`` of zeroed tuples in ``ctinfo`` IP_CT_NEW until conntrack runs): only ``CT
--notrack`` is.

``-m state`` is ``state_mt`` (net/netfilter/xt_state.c), the same state test alone: ``if (ct)
statebit = XT_STATE_BIT(ctinfo); else if (ctinfo == IP_CT_UNTRACKED) statebit =
XT_STATE_UNTRACKED; else statebit = XT_STATE_INVALID``.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.addr import parse_cidr
from emulation.netfilter.context import Ctx
from emulation.netfilter.matches.base import Match, Pred, neg_word, parse_port_range

__all__ = ["CT_STATES", "Conntrack"]

CT_STATES = ("INVALID", "NEW", "RELATED", "ESTABLISHED", "UNTRACKED", "SNAT", "DNAT")
#: The states of a packet with no entry (``ct == NULL``).
_NO_ENTRY = frozenset({"INVALID", "UNTRACKED"})
_TUPLE_FIELD = {"src": 0, "srcport": 1, "dst": 2, "dstport": 3}  # in (src, sport, dst, dport)


def _packet_ct_state(ctx: Ctx) -> tuple[str, bool]:
    """The packet's conntrack state as ``conntrack_mt`` sees it, and whether it has an entry.

    Returns:
        ``(state, entry)``: ``state`` is NEW, ESTABLISHED or RELATED with an entry (``entry``
        True), INVALID or UNTRACKED without one. The evaluator leaves ``ctx.ctstate`` at its
        initial NEW, with no tuples, until the conntrack hook; there (raw PREROUTING and OUTPUT)
        the kernel's packet has no ``_nfct`` yet, so it is INVALID, or UNTRACKED once a ``CT
        --notrack`` ran (``xt_ct_target``: ``nf_ct_set(skb, NULL, IP_CT_UNTRACKED)`` at once).
    """
    state = ctx.ctstate
    if state in _NO_ENTRY:
        return state, False
    if ctx.ct_orig is None or ctx.ct_reply is None:
        return ("UNTRACKED" if ctx.notrack else "INVALID"), False
    return state, True


@dataclass(frozen=True, slots=True)
class Conntrack(Match):
    """``-m conntrack`` / ``-m state`` (``conntrack_mt`` in xt_conntrack.c, ``state_mt`` in xt_state.c).

    ``--ctstate`` tests the packet's state (INVALID, NEW, RELATED, ESTABLISHED, UNTRACKED) and
    the pseudo-states SNAT/DNAT (the entry's source / destination is translated). Also
    ``--ctorigsrc/--ctorigdst/--ctreplsrc/--ctrepldst``, ``--ctorigdstport`` etc. and ``--ctdir``,
    which are tested only when the packet has an entry (see the module docstring).

    Attributes:
        states: the ``--ctstate`` (or ``--state``) list; empty when not given.
        states_neg: ``! --ctstate``.
        tuple_checks: ``(option, negated, value)`` per address or port option, in save order.
        direction: ``ORIGINAL``, ``REPLY`` or ``None`` (no ``--ctdir``).
        legacy_state: written as ``-m state --state``.
    """

    states: frozenset[str] = frozenset()
    states_neg: bool = False
    tuple_checks: tuple[tuple[str, bool, str], ...] = ()  # (option, negated, value)
    direction: str | None = None
    legacy_state: bool = False  # written as -m state --state

    @property
    def module(self) -> str:  # type: ignore[override]
        return "state" if self.legacy_state else "conntrack"

    def compile(self, uid: int) -> Pred | None:
        if self.tuple_checks or self.direction is not None or not self.states:
            return Match.compile(self, uid)
        states, neg = self.states, self.states_neg
        dnat, snat = "DNAT" in states, "SNAT" in states
        no_entry_hit = {s: (s in states) != neg for s in _NO_ENTRY}  # ct == NULL: the state bit alone

        def pred(ctx: Ctx) -> bool:
            state = ctx.ctstate
            if state in no_entry_hit:
                return no_entry_hit[state]
            if ctx.ct_orig is None or ctx.ct_reply is None:  # before the conntrack hook
                return no_entry_hit["UNTRACKED" if ctx.notrack else "INVALID"]
            return (state in states or (dnat and ctx.ct_dnat) or (snat and ctx.ct_snat)) != neg

        return pred

    def test(self, ctx: Ctx, uid: int) -> bool | None:
        state, entry = _packet_ct_state(ctx)
        if self.states:
            hit = state in self.states
            if entry and not hit:  # the SNAT/DNAT bits exist only with an entry
                hit = ("DNAT" in self.states and ctx.ct_dnat) or ("SNAT" in self.states and ctx.ct_snat)
            if hit == self.states_neg:
                return False
        if not entry:
            return bool(self.states)  # return info->match_flags & XT_CONNTRACK_STATE
        if self.direction is not None and (self.direction == "REPLY") != ctx.ct_dir_reply:
            return False
        for opt, neg, value in self.tuple_checks:
            tup = ctx.ct_orig if opt.startswith("--ctorig") else ctx.ct_reply
            assert tup is not None  # an entry has both tuples (_packet_ct_state)
            field_ = opt.removeprefix("--ctorig").removeprefix("--ctrepl")
            got = tup[_TUPLE_FIELD[field_]]
            if field_ in ("src", "dst"):
                hit = parse_cidr(value).contains(ctx.version, got)
            else:
                lo, hi = parse_port_range(value)
                hit = lo <= got <= hi
            if hit == neg:
                return False
        return True

    def save_args(self) -> list[str]:
        states = ",".join(s for s in CT_STATES if s in self.states)
        if self.legacy_state:
            return [*neg_word(self.states_neg), "--state", states]
        out: list[str] = []
        if self.states:
            out += [*neg_word(self.states_neg), "--ctstate", states]
        for opt, neg, value in self.tuple_checks:
            out += [*neg_word(neg), opt, value]
        if self.direction:
            out += ["--ctdir", self.direction]
        return out
