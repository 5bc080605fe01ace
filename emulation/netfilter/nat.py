"""Choosing a new flow's source port for source NAT, as the kernel's ``get_unique_tuple``.

Theory of operation (net/netfilter/nf_nat_core.c, ``nf_nat_setup_info`` ->
``get_unique_tuple`` -> ``nf_nat_l4proto_unique_tuple``). Every new tracked flow gets a
source mapping when it leaves the nat table at POSTROUTING or INPUT: the one its SNAT or
MASQUERADE rule asked for, or a *null binding* to its own source when none did. The mapping
must leave the flow a reply tuple no other conntrack entry holds (``nf_nat_used_tuple``: the
candidate's inverse is looked up in the table). For a range of one address (all that
MASQUERADE and kube-proxy's rules give), with ``random`` meaning ``--random`` or
``--random-fully`` (``NF_NAT_RANGE_PROTO_RANDOM_ALL``):

1. Not random: the flow's own source, when it is inside the range (a null binding, or SNAT to
   the address it already has), is kept if its reply tuple is free. Otherwise an existing
   mapping of the same original source (address, port, protocol), found through the
   ``bysource`` table (``find_appropriate_src``), is reused when it is inside the range and
   free: a client keeps one public port across destinations.
2. The range's address with the flow's own port. Not random: kept when free and, with
   ``--to-ports``, inside the ports (a range of one port is kept even when taken).
3. ``nf_nat_l4proto_unique_tuple``: ports ``--to-ports`` or, without them, 1-511, 600-1023 or
   1024-65535 as the original port is below 512, below 1024, or not. From a random 16-bit
   offset, up to 128 consecutive ports (wrapping within the range) are tried; a round with
   none free is followed by one from a new offset with half as many tries, unless it tried
   the whole range or fewer than 16. When even that fails the last port tried stays, and the
   kernel drops the packet when it confirms the entry (``__nf_conntrack_confirm``: the reply
   tuple is taken).

Destination NAT never changes the port it was given (``DNAT --to-destination ADDR:PORT`` is a
range of one port, kept even when taken). ICMP ids are not remapped here (the kernel remaps
them like ports, in 0-65535): their flows keep their id, and on a clash the newer entry takes
the shared reply tuple (replies go to it; the older keeps its original tuple).

Kernels since 6.8 test the flow's own tuple (step 1) with ``nf_nat_used_tuple_new``, which
lets a UDP flow keep its port when its only clash is the reverse of a flow that was not
NATed (two peers opening to each other at once); that nuance is not modelled: such a flow's
port is remapped here.

The random offset comes from ``draw16`` (the sample generator in
:meth:`~emulation.netfilter.Netns.send`). ``enumerate`` does not branch on port choices: it
takes offset 0 and searches the whole range once, so it reports a drop only when no port is
free (the kernel's rounds from random offsets miss a free port only by rare bad luck).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from emulation.conntrack import ConntrackTable

__all__ = [
    "MAX_ATTEMPTS",
    "PORTED",
    "SourceRange",
    "choose_source_port",
    "port_range",
    "search_ports",
    "source_port",
]

#: The most ports one round tries (``max_attempts`` in nf_nat_l4proto_unique_tuple).
MAX_ATTEMPTS = 128
#: Protocols whose source port NAT remaps.
PORTED = frozenset({"tcp", "udp", "sctp"})

#: ``(address, low port, high port, random)`` a source mapping asks for: ``address`` ``None``
#: for a null binding (the flow's own source), ports ``None`` without ``--to-ports``/``:PORT``.
SourceRange = tuple[int | None, int | None, int | None, bool]


def port_range(sport: int, low: int | None, high: int | None) -> tuple[int, int]:
    """``(first port, how many)`` a source port is searched in: the range asked for, or the
    privileged part the original port is in (1-511, 600-1023) or 1024-65535."""
    if low is not None and high is not None:
        low, high = min(low, high), max(low, high)
        return low, high - low + 1
    if sport < 1024:
        return (1, 511) if sport < 512 else (600, 424)
    return 1024, 65536 - 1024


def search_ports(
    first: int,
    size: int,
    taken: Callable[[int], bool],
    draw16: Callable[[], int],
    *,
    off: int | None = None,
    tried: int = 0,
    last: int = 0,
    exhaustive: bool = False,
) -> tuple[int, bool]:
    """``nf_nat_l4proto_unique_tuple``'s search: rounds of consecutive ports from random
    offsets (see the module docstring); ``(port, free)``. ``off`` and ``tried``: the first
    round's offset and how many of its ports were already tried (``last`` the last of them).
    ``exhaustive``: one round over the whole range instead (``enumerate``: a port is found
    whenever one is free, as the kernel's random rounds almost always find it)."""
    attempts = size if exhaustive else min(size, MAX_ATTEMPTS)
    if off is None:
        off = draw16()
    port, i = last, tried
    while True:
        while i < attempts:
            port = first + off % size
            if not taken(port):
                return port, True
            off = (off + 1) & 0xFFFF
            i += 1
        if attempts >= size or attempts < 16:
            return port, False
        attempts //= 2
        off, i = draw16(), 0


def choose_source_port(
    *,
    proto: str,
    src: int,
    sport: int,
    addr: int,
    low: int | None,
    high: int | None,
    random: bool,
    taken: Callable[[int], bool],
    mappings: Callable[[], Iterable[tuple[int, int]]],
    draw16: Callable[[], int],
    exhaustive: bool = False,
) -> tuple[int, bool]:
    """The source port of a flow mapped to ``addr``, and whether its reply tuple is free.

    Args:
        proto: the flow's protocol; only tcp, udp and sctp ports are remapped.
        src, sport: the flow's source before the mapping (address as an integer).
        addr: the address it is mapped to (its own for a null binding).
        low, high: the port range asked for, or ``None`` for none.
        random: ``--random`` or ``--random-fully``.
        taken: ``taken(port)``: another entry holds the reply tuple the flow gets with source
            ``addr:port``.
        mappings: the ``(address, port)`` mappings existing entries of the same original
            source got, most recent first (``find_appropriate_src``'s walk of its bucket).
        draw16: a random integer in 0..65535.
        exhaustive: search the whole range once from ``draw16()`` (see :func:`search_ports`).

    Returns:
        ``(port, free)``; ``free`` is False when no port in the range was free (the kernel
        then drops the packet at confirmation).

    As get_unique_tuple and nf_nat_l4proto_unique_tuple in net/netfilter/nf_nat_core.c.
    """
    if low is not None and high is not None and high < low:
        low, high = high, low

    def inside(port: int) -> bool:
        return low is None or high is None or low <= port <= high

    if not random:
        if src == addr and inside(sport):
            if not taken(sport):
                return sport, True
        else:
            for m_addr, m_port in mappings():
                if m_addr == addr and inside(m_port):
                    if not taken(m_port):
                        return m_port, True
                    break  # the first one in range is the one tried
        if low is not None and high is not None:
            if low <= sport <= high:
                if low == high:  # one port: kept, free or not
                    return sport, not taken(sport)
                if not taken(sport):
                    return sport, True
        elif not taken(sport):
            return sport, True
    if proto not in PORTED:
        return sport, True  # ICMP ids are not remapped here (see the module docstring)
    first, size = port_range(sport, low, high)
    return search_ports(first, size, taken, draw16, exhaustive=exhaustive)


def _zero() -> int:
    return 0


def source_port(
    table: ConntrackTable,
    version: int,
    proto: str,
    src: int,
    sport: int,
    dst: int,
    dport: int,
    mapping: SourceRange,
    rand: Callable[[], float] | None,
) -> tuple[int, bool]:
    """The source port a new flow ``src:sport -> dst:dport`` gets when mapped to ``mapping``
    (``address`` ``None``: its own) with ``table`` holding the other flows, and whether its reply
    tuple is free; see :func:`choose_source_port`. Random offsets come from ``rand`` (sample
    mode), or are 0 (``enumerate`` does not branch on them)."""
    addr, low, high, rand_all = mapping
    if addr is None:
        addr = src
    if rand_all:
        if proto in PORTED:
            # --random-fully, kube-proxy's masquerade: the first port from a random offset is
            # nearly always free; the search goes on from there when it is not.
            first, size = port_range(sport, low, high)
            off = int(rand() * 65536) if rand is not None else 0
            port = first + off % size
            if not table.taken((version, dst, dport, addr, port, proto)):
                return port, True
            return search_ports(
                first,
                size,
                lambda p: table.taken((version, dst, dport, addr, p, proto)),
                (lambda: int(rand() * 65536)) if rand is not None else _zero,
                off=(off + 1) & 0xFFFF,
                tried=1,
                last=port,
                exhaustive=rand is None,
            )
    elif low is None and addr == src and not table.taken((version, dst, dport, addr, sport, proto)):
        return sport, True  # a null binding, decided by one lookup: its own port, free
    return choose_source_port(
        proto=proto,
        src=src,
        sport=sport,
        addr=addr,
        low=low,
        high=high,
        random=rand_all,
        taken=lambda p: table.taken((version, dst, dport, addr, p, proto)),
        mappings=lambda: table.source_mappings(version, src, sport, proto),
        draw16=(lambda: int(rand() * 65536)) if rand is not None else _zero,
        exhaustive=rand is None,
    )
