"""The ipvs mode's state in the kernel tools' own formats, and the one-call renderer.

- :func:`spec_of` / :func:`dest_spec_of` turn a :class:`VirtualServer` / :class:`RealServer`
  into what ``ipvsadm -A`` / ``-a`` hands the kernel (:mod:`emulation.ipvs`).
- :func:`build_table` loads a whole state into a fresh :class:`emulation.ipvs.IpvsTable` (each
  real server added in turn, so each goes to the head of its list, as the kernel does);
  :func:`format_ipvsadm_save` prints it as ``ipvsadm-save -n``.
- :func:`format_ipset_restore` writes the sets as ``ipset -exist restore`` input (``create``
  as ``ensureIPSet``, a ``flush``, then the entries: the end state of ``syncIPSetEntries``).
- :func:`render` does it all: :class:`IpvsRender` holds the state and the three texts.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.ipvs import DestSpec, IpvsTable, ServiceKey, ServiceSpec, Sysctls, format_rules, parse_address
from kproxy.model.snapshot import Snapshot
from kproxy.modes.ipvs.config import IpvsConfig
from kproxy.modes.ipvs.render import render_state
from kproxy.modes.ipvs.rules import render_rules
from kproxy.modes.ipvs.state import IpsetEntries, IpvsState, RealServer, VirtualServer

__all__ = [
    "IpvsRender",
    "build_table",
    "dest_spec_of",
    "format_ipset_restore",
    "format_ipvsadm_save",
    "render",
    "spec_of",
]

#: ``setIPSetDefaults``: ``hashsize 1024``, ``maxelem 65536``, port range ``0-65535``.
HASH_SIZE, MAX_ELEM, PORT_RANGE = 1024, 65536, "0-65535"


def spec_of(vs: VirtualServer) -> ServiceSpec:
    """The ``ipvsadm -A`` specification of ``vs`` (netmask: all ones, per-client persistence)."""
    version, addr = parse_address(vs.address)
    proto = vs.protocol.lower()
    assert proto in ("tcp", "udp", "sctp")
    return ServiceSpec(key=ServiceKey(version, proto, addr, vs.port),  # type: ignore[arg-type]
                       scheduler=vs.scheduler, flags=vs.flags, timeout_s=vs.timeout_s)


def dest_spec_of(rs: RealServer) -> DestSpec:
    """The ``ipvsadm -a -m`` specification of ``rs`` (masquerading, kube-proxy's forwarding)."""
    return DestSpec(addr=parse_address(rs.address), port=rs.port, weight=rs.weight)


def build_table(state: IpvsState, sysctls: Sysctls | None = None) -> IpvsTable:
    """A fresh table holding ``state``'s virtual servers (added in order, each real server too)."""
    table = IpvsTable(sysctls or Sysctls.kube_proxy())
    for vs in state.virtual_servers:
        spec = spec_of(vs)
        table.add_service(spec)
        for rs in vs.real_servers:
            table.add_dest(spec.key, dest_spec_of(rs))
    return table


def format_ipvsadm_save(state: IpvsState) -> str:
    """``ipvsadm-save -n`` of ``state`` loaded into a fresh table."""
    return format_rules(build_table(state))


def _create(s: IpsetEntries) -> str:
    if s.set_type == "bitmap:port":
        return f"create {s.name} {s.set_type} range {PORT_RANGE}"
    family = "inet6" if s.family == 6 else "inet"
    return f"create {s.name} {s.set_type} family {family} hashsize {HASH_SIZE} maxelem {MAX_ELEM}"


def format_ipset_restore(state: IpvsState, *, flush: bool = True) -> str:
    """``ipset -exist restore`` input that leaves exactly ``state``'s entries in kube-proxy's sets
    (load it with ``-exist``: the sets may exist already, as after ``ensureIPSet``).

    Args:
        state: the rendered state.
        flush: empty each set before adding (False: only create and add, ``ipset save`` style).
    """
    lines: list[str] = []
    for s in state.ipsets:
        lines.append(_create(s))
        if flush:
            lines.append(f"flush {s.name}")
        lines += [f"add {s.name} {e}" for e in s.entries]
    return "".join(line + "\n" for line in lines)


@dataclass(frozen=True, slots=True, kw_only=True)
class IpvsRender:
    """One render of the ipvs mode.

    Attributes:
        config: the configuration used.
        state: the desired IPVS and ipset state.
        ipvsadm: ``ipvsadm-save -n`` text of the virtual servers.
        ipsets: ``ipset save``-style text (``create`` and ``add`` lines).
        iptables: the ``iptables-restore --noflush`` input.
    """

    config: IpvsConfig
    state: IpvsState
    ipvsadm: str
    ipsets: str
    iptables: str


def render(snapshot: Snapshot, config: IpvsConfig) -> IpvsRender:
    """Render ``snapshot`` for ``config.family`` (pure)."""
    state = render_state(snapshot, config)
    return IpvsRender(config=config, state=state, ipvsadm=format_ipvsadm_save(state),
                      ipsets=format_ipset_restore(state, flush=False), iptables=render_rules(state, config))
