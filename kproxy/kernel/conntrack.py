"""Stale conntrack entries of UDP (and SCTP) services: what to delete after a successful sync.

kube-proxy's ``conntrack.CleanStaleEntries`` (pkg/proxy/conntrack/cleanup.go) runs after every
successful sync: a UDP "connection" is a conntrack entry refreshed by every datagram, so a
client that keeps sending from one source port keeps the DNAT decided for its first datagram
forever, even after that endpoint is gone; and an entry made while a service had no endpoints
(no DNAT) keeps swallowing the flow after endpoints appear. Only connectionless protocols need
it (kube-proxy cleans UDP; kproxy cleans SCTP the same way).

:func:`stale_conntrack_filters` is pure: from the previously applied Snapshot and the new one it
computes conntrack delete filters (the filters kube-proxy uses, as ``conntrack -D`` options):

- for every serving endpoint IP of a UDP/SCTP service port that no longer serves it (removed,
  no longer serving, or the port or service deleted): ``--orig-dst FRONTEND --orig-port-dst
  PORT --reply-src EP`` for every frontend (ClusterIP, external IPs, load-balancer IPs, from
  the old and the new port), and ``--orig-port-dst NODEPORT --reply-src EP``;
- for a port that had no serving endpoint and now has some (newly active): ``--orig-dst IP
  --orig-port-dst PORT --reply-src IP`` for each frontend (entries never DNATed: their reply
  comes from the service IP itself), and ``--orig-port-dst NODEPORT`` (every entry to the
  NodePort; only when a previous Snapshot is known, so a restart does not cut live flows).

Appliers apply the filters: :class:`~kproxy.kernel.linux.LinuxNetfilter` with the ``conntrack``
tool, :class:`~kproxy.kernel.emulated.EmulatedNetfilter` on the emulated conntrack table.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from emulation.conntrack import ConntrackEntry
from kproxy.model.names import IPFamily
from kproxy.model.names import Protocol as L4Protocol
from kproxy.model.snapshot import ServicePortInfo, Snapshot

__all__ = ["CLEANED_PROTOCOLS", "ConntrackCleaner", "ConntrackFilter", "stale_conntrack_filters"]

#: The service protocols whose stale entries are deleted, with conntrack's name for them.
CLEANED_PROTOCOLS: dict[L4Protocol, str] = {L4Protocol.UDP: "udp", L4Protocol.SCTP: "sctp"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ConntrackFilter:
    """One ``conntrack -D`` filter; None fields do not filter.

    Attributes:
        family: the IP family (``-f ipv4``/``ipv6``).
        protocol: ``udp`` or ``sctp`` (``-p``).
        orig_dst: the original destination (``--orig-dst``), a service IP.
        orig_dst_port: the original destination port (``--orig-port-dst``).
        reply_src: the reply's source (``--reply-src``): the endpoint the entry DNATs to.
    """

    family: IPFamily
    protocol: str
    orig_dst: str | None = None
    orig_dst_port: int | None = None
    reply_src: str | None = None

    def argv(self) -> tuple[str, ...]:
        """The ``conntrack`` arguments deleting the matching entries."""
        out = ["-D", "-f", "ipv6" if self.family is IPFamily.IPv6 else "ipv4", "-p", self.protocol]
        if self.orig_dst is not None:
            out += ["--orig-dst", self.orig_dst]
        if self.orig_dst_port is not None:
            out += ["--orig-port-dst", str(self.orig_dst_port)]
        if self.reply_src is not None:
            out += ["--reply-src", self.reply_src]
        return tuple(out)

    def matches(self, entry: ConntrackEntry) -> bool:
        """Whether an emulated conntrack entry matches this filter."""
        version, _, _, dst, dport, proto = entry.original
        if version != (6 if self.family is IPFamily.IPv6 else 4) or proto != self.protocol:
            return False
        if self.orig_dst is not None and dst != int(ipaddress.ip_address(self.orig_dst)):
            return False
        if self.orig_dst_port is not None and dport != self.orig_dst_port:
            return False
        return self.reply_src is None or entry.reply[1] == int(ipaddress.ip_address(self.reply_src))

    def __str__(self) -> str:
        return " ".join(self.argv()[1:])


@runtime_checkable
class ConntrackCleaner(Protocol):
    """An applier that can delete conntrack entries (the optional hook of the iptables mode)."""

    async def clear_conntrack(self, filters: Sequence[ConntrackFilter]) -> int:
        """Delete the entries matching any of ``filters``; return how many were deleted.

        Raises:
            KernelError: the deletion failed.
        """
        ...


def _serving_ips(info: ServicePortInfo | None) -> frozenset[str]:
    if info is None:
        return frozenset()
    return frozenset(ep.ip for ep in info.endpoints if ep.serving)


def _frontends(info: ServicePortInfo | None) -> set[tuple[str, int]]:
    if info is None:
        return set()
    return {(ip, info.port) for ip in (info.cluster_ip, *info.external_ips, *info.load_balancer_ips)}


def _node_ports(info: ServicePortInfo | None) -> set[int]:
    return {info.node_port} if info is not None and info.node_port else set()


def _key(f: ConntrackFilter) -> tuple[str, str, int, str]:
    return (f.protocol, f.orig_dst or "", f.orig_dst_port or 0, f.reply_src or "")


def stale_conntrack_filters(previous: Snapshot | None, snapshot: Snapshot,
                            family: IPFamily) -> tuple[ConntrackFilter, ...]:
    """The conntrack delete filters for going from ``previous`` to ``snapshot`` in ``family``.

    Args:
        previous: the Snapshot applied before (None: nothing known, e.g. the first sync).
        snapshot: the Snapshot just applied.
        family: the IP family synced.

    Returns:
        The filters (see the module docstring), deduplicated and sorted.
    """
    old_ports = previous.family(family) if previous is not None else {}
    new_ports = snapshot.family(family)
    out: set[ConntrackFilter] = set()
    for spn in set(old_ports) | set(new_ports):
        proto = CLEANED_PROTOCOLS.get(spn.protocol)
        if proto is None:
            continue
        old, new = old_ports.get(spn), new_ports.get(spn)
        old_ips, new_ips = _serving_ips(old), _serving_ips(new)
        frontends = _frontends(old) | _frontends(new)
        node_ports = _node_ports(old) | _node_ports(new)
        for ep_ip in old_ips - new_ips:
            out.update(ConntrackFilter(family=family, protocol=proto, orig_dst=ip, orig_dst_port=port,
                                       reply_src=ep_ip) for ip, port in frontends)
            out.update(ConntrackFilter(family=family, protocol=proto, orig_dst_port=np, reply_src=ep_ip)
                       for np in node_ports)
        if new_ips and not old_ips:
            out.update(ConntrackFilter(family=family, protocol=proto, orig_dst=ip, orig_dst_port=port,
                                       reply_src=ip) for ip, port in _frontends(new))
            if previous is not None:
                out.update(ConntrackFilter(family=family, protocol=proto, orig_dst_port=np)
                           for np in _node_ports(new))
    return tuple(sorted(out, key=_key))
