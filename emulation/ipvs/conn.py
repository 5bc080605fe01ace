"""Connection entries and the per-protocol state machines (``ip_vs_conn.c``, ``ip_vs_proto_*.c``).

Theory of operation: a :class:`Conn` is ``struct ip_vs_conn``. A new one starts in state NONE
with the ``INACTIVE`` flag inherited from its real server's ``conn_flags`` and is bound to the
server (``ip_vs_bind_dest``: ``inactconns++``, or ``persistconns++`` for a template). Every
packet runs the protocol's transition (:func:`tcp_transition`, :func:`udp_transition`), which
moves the connection between the server's active and inactive counters and sets the timeout of
the new state; the caller then re-arms the timer (``ip_vs_conn_put``). When the timer fires the
connection is unbound (``ip_vs_unbind_dest``) unless it still controls others (a persistence
template with ``n_control > 0`` is re-armed for 60 s instead, ``ip_vs_conn_expire``).

The TCP tables are ``tcp_states`` of ``ip_vs_proto_tcp.c`` (the default, not ``secure_tcp``),
as rows ``(direction, flag) -> next state for each current state``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from emulation.ipvs.errors import IpvsError
from emulation.ipvs.model import Dest

__all__ = [
    "TCP_TIMEOUTS_S",
    "TEMPLATE_REARM_S",
    "UDP_TIMEOUT_S",
    "Conn",
    "TcpFlags",
    "TcpState",
    "bind_dest",
    "state_name",
    "tcp_transition",
    "udp_transition",
    "unbind_dest",
]


class TcpState(IntEnum):
    """``IP_VS_TCP_S_*`` in include/uapi/linux/ip_vs.h order."""

    NONE = 0
    ESTABLISHED = 1
    SYN_SENT = 2
    SYN_RECV = 3
    FIN_WAIT = 4
    TIME_WAIT = 5
    CLOSE = 6
    CLOSE_WAIT = 7
    LAST_ACK = 8
    LISTEN = 9
    SYNACK = 10


_S = TcpState
#: ``tcp_timeouts[]`` (seconds): what ``cp->timeout`` becomes on entering each state.
TCP_TIMEOUTS_S: dict[TcpState, float] = {
    _S.NONE: 2,
    _S.ESTABLISHED: 15 * 60,
    _S.SYN_SENT: 2 * 60,
    _S.SYN_RECV: 1 * 60,
    _S.FIN_WAIT: 2 * 60,
    _S.TIME_WAIT: 2 * 60,
    _S.CLOSE: 10,
    _S.CLOSE_WAIT: 60,
    _S.LAST_ACK: 30,
    _S.LISTEN: 2 * 60,
    _S.SYNACK: 120,
}
#: ``udp_timeouts[IP_VS_UDP_S_NORMAL]``.
UDP_TIMEOUT_S = 5 * 60
#: ``ip_vs_conn_expire``: a connection that still controls others is re-armed with this timeout.
TEMPLATE_REARM_S = 60
#: ``tcp_state_active_table``: states counted in ``activeconns``.
_ACTIVE = frozenset({_S.ESTABLISHED, _S.SYN_SENT, _S.SYN_RECV, _S.SYNACK})

_COLS = (_S.NONE, _S.ESTABLISHED, _S.SYN_SENT, _S.SYN_RECV, _S.FIN_WAIT, _S.TIME_WAIT, _S.CLOSE,
         _S.CLOSE_WAIT, _S.LAST_ACK, _S.LISTEN, _S.SYNACK)  # fmt: skip


def _row(text: str) -> tuple[TcpState, ...]:
    names = {"NO": _S.NONE, "ES": _S.ESTABLISHED, "SS": _S.SYN_SENT, "SR": _S.SYN_RECV, "FW": _S.FIN_WAIT,
             "TW": _S.TIME_WAIT, "CL": _S.CLOSE, "CW": _S.CLOSE_WAIT, "LA": _S.LAST_ACK, "LI": _S.LISTEN,
             "SA": _S.SYNACK}  # fmt: skip
    row = tuple(names[w] for w in text.split())
    assert len(row) == len(_COLS)
    return row


# tcp_states[] in ip_vs_proto_tcp.c: rows syn, fin, ack, rst for INPUT, OUTPUT, INPUT-ONLY.
#        columns: sNO sES sSS sSR sFW sTW sCL sCW sLA sLI sSA
_TABLE: dict[str, tuple[tuple[TcpState, ...], ...]] = {
    "input": (
        _row("SR ES ES SR SR SR SR SR SR SR SR"),
        _row("CL CW SS TW TW TW CL CW LA LI TW"),
        _row("ES ES SS ES FW TW CL CW CL LI ES"),
        _row("CL CL CL SR CL CL CL CL LA LI SR"),
    ),
    "output": (
        _row("SS ES SS SR SS SS SS SS SS LI SR"),
        _row("TW FW SS TW FW TW CL TW LA LI TW"),
        _row("ES ES SS ES FW TW CL CW LA ES ES"),
        _row("CL CL SS CL CL TW CL CL CL CL CL"),
    ),
    "input_only": (
        _row("SR ES ES SR SR SR SR SR SR SR SR"),
        _row("CL FW SS TW FW TW CL CW LA LI TW"),
        _row("ES ES SS ES FW TW CL CW CL LI ES"),
        _row("CL CL CL SR CL CL CL CL LA LI CL"),
    ),
}


@dataclass(frozen=True, slots=True)
class TcpFlags:
    """The TCP header flags the state machine reads; parse ``"S"``, ``"SA"``, ``"F"``, ``"R"``, ``"A"``."""

    syn: bool = False
    ack: bool = False
    fin: bool = False
    rst: bool = False

    @classmethod
    def parse(cls, text: str) -> TcpFlags:
        """``"SA"`` -> SYN+ACK. Letters: S, A, F, R (case-insensitive); ``""`` means none.

        Raises:
            IpvsError: an unknown letter.
        """
        bad = set(text.upper()) - set("SAFR")
        if bad:
            raise IpvsError(f"tcp flags {text!r}: unknown {sorted(bad)}; use S, A, F, R")
        t = text.upper()
        return cls(syn="S" in t, ack="A" in t, fin="F" in t, rst="R" in t)

    def index(self) -> int | None:
        """``tcp_state_idx``: RST beats SYN beats FIN beats ACK; ``None`` when none is set."""
        if self.rst:
            return 3
        if self.syn:
            return 0
        if self.fin:
            return 1
        if self.ack:
            return 2
        return None


class Conn:
    """One connection or persistence template (``struct ip_vs_conn``).

    Attributes:
        protocol: ``tcp``/``udp``/``sctp`` (a fwmark template uses ``"ip"``).
        version: 4 or 6.
        caddr, cport, vaddr, vport, daddr, dport: client, virtual and real endpoints.
        dest: the real server (kept even after it is deleted from its service).
        template: a persistence template (``IP_VS_CONN_F_TEMPLATE``).
        inactive: the ``IP_VS_CONN_F_INACTIVE`` flag.
        state: ``TcpState`` value for TCP, 0 (``UDP``) for UDP, 0 (``NONE``) for templates.
        timeout_s: the current state's timeout; ``expires_s`` the absolute time the timer fires.
        control: the template controlling this connection, if any.
        n_control: how many connections this template controls.
        noutput: ``IP_VS_CONN_F_NOOUTPUT`` (non-NAT forwarding: replies bypass the balancer).
        nfct: ``IP_VS_CONN_F_NFCT`` (conntrack kept for it, ``net.ipv4.vs.conntrack=1``).
        seq: creation order, for stable listings.
    """

    __slots__ = ("caddr", "control", "cport", "daddr", "dest", "dport", "expires_s", "gen", "hashed",
                 "inactive", "n_control", "nfct", "noutput", "protocol", "seq", "service", "state",
                 "template", "timeout_s", "vaddr", "version", "vport")  # fmt: skip

    def __init__(
        self,
        *,
        protocol: str,
        version: int,
        caddr: int,
        cport: int,
        vaddr: int,
        vport: int,
        daddr: int,
        dport: int,
        dest: Dest,
        template: bool,
        noutput: bool,
        nfct: bool,
        seq: int,
        service: object,
    ) -> None:
        self.protocol = protocol
        self.version = version
        self.caddr, self.cport, self.vaddr, self.vport = caddr, cport, vaddr, vport
        self.daddr, self.dport = daddr, dport
        self.dest = dest
        self.template = template
        self.inactive = True
        self.state = 0
        self.timeout_s: float = 3.0
        self.expires_s: float = 0.0
        self.control: Conn | None = None
        self.n_control = 0
        self.noutput = noutput
        self.nfct = nfct
        self.seq = seq
        self.gen = 0
        self.hashed = True
        self.service = service

    @property
    def in_key(self) -> tuple[str, int, int, int, int, int]:
        """``ip_vs_conn_in_get``'s match: protocol, client and virtual endpoints."""
        return (self.protocol, self.version, self.caddr, self.cport, self.vaddr, self.vport)

    @property
    def out_key(self) -> tuple[str, int, int, int, int, int]:
        """``ip_vs_conn_out_get``'s match of a reply: protocol, real then client endpoint."""
        return (self.protocol, self.version, self.daddr, self.dport, self.caddr, self.cport)

    def __repr__(self) -> str:
        kind = "template" if self.template else self.protocol
        return f"Conn({kind} {self.caddr}:{self.cport} -> {self.dest.label} {state_name(self)})"


def state_name(conn: Conn) -> str:
    """The state as ``/proc/net/ip_vs_conn`` prints it (``ESTABLISHED``, ``UDP``, ``NONE`` ...)."""
    if conn.template:
        return "NONE"
    if conn.protocol == "udp":
        return "UDP"
    return TcpState(conn.state).name


def bind_dest(conn: Conn, dest: Dest) -> None:
    """``ip_vs_bind_dest``: count the new connection and maybe set ``OVERLOAD``."""
    dest.refs += 1
    if conn.template:
        dest.persistconns += 1
    elif conn.inactive:
        dest.inactconns += 1
    else:
        dest.activeconns += 1
    if dest.u_threshold and dest.totalconns() >= dest.u_threshold:
        dest.overloaded = True


def unbind_dest(conn: Conn) -> None:
    """``ip_vs_unbind_dest``: uncount the connection and maybe clear ``OVERLOAD``."""
    dest = conn.dest
    if conn.template:
        dest.persistconns -= 1
    elif conn.inactive:
        dest.inactconns -= 1
    else:
        dest.activeconns -= 1
    if dest.l_threshold:
        if dest.totalconns() < dest.l_threshold:
            dest.overloaded = False
    elif dest.u_threshold:
        if dest.totalconns() * 4 < dest.u_threshold * 3:
            dest.overloaded = False
    else:
        dest.overloaded = False
    dest.refs -= 1


def tcp_transition(conn: Conn, direction: str, flags: TcpFlags, timeouts: dict[TcpState, float]) -> None:
    """``set_tcp_state``: next state from the table, counters moved, timeout of the new state.

    ``direction`` is ``input`` (client to balancer) or ``output`` (a reply through it). A
    connection with ``NOOUTPUT`` uses the INPUT-ONLY rows until a reply is seen.
    """
    table = "output" if direction == "output" else "input"
    if conn.noutput:
        if direction == "output":
            conn.noutput = False
        else:
            table = "input_only"
    idx = flags.index()
    new = _S.CLOSE if idx is None else _TABLE[table][idx][conn.state]
    if new != conn.state:
        dest = conn.dest
        active = new in _ACTIVE
        if not conn.inactive and not active:
            dest.activeconns -= 1
            dest.inactconns += 1
            conn.inactive = True
        elif conn.inactive and active:
            dest.activeconns += 1
            dest.inactconns -= 1
            conn.inactive = False
    conn.state = new
    conn.timeout_s = timeouts[new]


def udp_transition(conn: Conn, udp_timeout_s: float) -> None:
    """``udp_state_transition``: one state; every packet sets the UDP timeout (300 s by default)."""
    conn.timeout_s = udp_timeout_s
