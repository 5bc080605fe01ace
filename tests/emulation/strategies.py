# ruff: noqa: E501  (iptables rules are long lines; they are kept whole to stay readable)
"""Hypothesis strategies for the netfilter emulator: kube-proxy-like rulesets and packets for them.

The rulesets are big enough for the chain index to engage (KUBE-SERVICES by destination,
KUBE-NODEPORTS by port) and mix in what makes skipping rules delicate: endpoints chosen by
``statistic --mode random``, ``recent`` affinity, ``statistic --mode nth``, a match the
emulator does not model, rules without a target and a goto. Values are biased toward the
edges the index keys on: service addresses and ports, ports 0, 1 and 65535, node-local and
pod sources.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from emulation.packet import Packet

NODE_IP = "192.168.0.2"


@dataclass(frozen=True)
class KubeRuleset:
    """Restore input plus the addresses and ports its rules key on."""

    text: str
    vips: tuple[str, ...]
    ports: tuple[int, ...]
    node_ports: tuple[int, ...]


def _service_rules(
    s: int, vip: str, port: int, proto: str, endpoints: int, node_port: int | None, affinity: bool
) -> tuple[list[str], list[str], list[str]]:
    """Chain declarations, KUBE-SERVICES / KUBE-NODEPORTS rules and the service's own rules."""
    svc = f"KUBE-SVC-{s:04d}"
    chains = [f":{svc} - [0:0]"]
    top: list[str] = []
    own: list[str] = []
    if endpoints == 0:
        top.append(
            f'-A KUBE-SERVICES -m comment --comment "ns/svc{s} has no endpoints" -d {vip}/32 -p {proto} -m {proto} --dport {port} -j RETURN'
        )
        return chains, top, own
    top.append(
        f'-A KUBE-SERVICES -m comment --comment "ns/svc{s} cluster IP" -m {proto} -p {proto} -d {vip} --dport {port} -j {svc}'
    )
    if node_port is not None:
        top.append(
            f'-A KUBE-NODEPORTS -m comment --comment "ns/svc{s}" -m {proto} -p {proto} --dport {node_port} -j {svc}'
        )
    own.append(
        f"-A {svc} -d {vip}/32 -p {proto} -m {proto} --dport {port} ! -s 10.0.0.0/16 -j KUBE-MARK-MASQ"
    )
    for e in range(endpoints):
        sep = f"KUBE-SEP-{s:04d}{e:02d}"
        ip = f"10.0.{s % 250 + 1}.{e + 1}"
        chains.append(f":{sep} - [0:0]")
        if affinity:
            own.append(f"-A {svc} -m recent --name {sep} --rcheck --seconds 10800 --reap -j {sep}")
        stat = (
            f"-m statistic --mode random --probability {1 / (endpoints - e):.10f} "
            if e < endpoints - 1
            else ""
        )
        own.append(f"-A {svc} {stat}-j {sep}")
        own.append(f"-A {sep} -s {ip}/32 -j KUBE-MARK-MASQ")
        recent = f"-m recent --set --name {sep} --rsource " if affinity else ""
        own.append(f"-A {sep} -p {proto} {recent}-m {proto} -j DNAT --to-destination {ip}:{port + 8000}")
    return chains, top, own


@st.composite
def kube_rulesets(draw: st.DrawFn, *, min_services: int = 16, max_services: int = 24) -> KubeRuleset:
    """A nat and filter dump shaped like kube-proxy's, with every chain long enough to index."""
    n = draw(st.integers(min_value=min_services, max_value=max_services))
    chains = [
        ":KUBE-SERVICES - [0:0]",
        ":KUBE-NODEPORTS - [0:0]",
        ":KUBE-POSTROUTING - [0:0]",
        ":KUBE-MARK-MASQ - [0:0]",
        ":KUBE-EXTRA - [0:0]",
    ]
    top: list[str] = []
    nodeports: list[str] = []
    own: list[str] = []
    vips, ports, node_ports = [], [], []
    for s in range(n):
        vip = f"172.30.{s // 200}.{s % 200 + 1}"
        port = draw(st.sampled_from([80, 443, 53, 1, 65535 - 8000]))
        proto = draw(st.sampled_from(["tcp", "udp"]))
        endpoints = draw(st.integers(min_value=0, max_value=3))
        node_port = 30000 + s if draw(st.booleans()) else None
        c, t, o = _service_rules(s, vip, port, proto, endpoints, node_port, draw(st.booleans()))
        chains += c
        own += o
        top += [r for r in t if r.startswith("-A KUBE-SERVICES")]
        nodeports += [r for r in t if r.startswith("-A KUBE-NODEPORTS")]
        vips.append(vip)
        ports.append(port)
        if node_port is not None and endpoints:
            node_ports.append(node_port)
    # Rules with no key, spread through the keyed ones (each counts or changes state).
    extras = [
        "-A KUBE-SERVICES -m statistic --mode nth --every 3 --packet 1",
        "-A KUBE-SERVICES -m physdev --physdev-is-bridged -j KUBE-EXTRA",
        "-A KUBE-SERVICES -p tcp -m statistic --mode random --probability 0.5000000000 -m tcp --dport 80",
        "-A KUBE-SERVICES -m mark --mark 0x1/0x1 -g KUBE-EXTRA",
        "-A KUBE-NODEPORTS -m recent --set --name seen --rsource -m tcp -p tcp --dport 30001",
        "-A KUBE-NODEPORTS -p udp -m udp ! --dport 30002 -m comment --comment negated",
    ]
    for extra in draw(st.lists(st.sampled_from(extras), max_size=4, unique=True)):
        table = top if extra.startswith("-A KUBE-SERVICES") else nodeports
        table.insert(draw(st.integers(min_value=0, max_value=len(table))), extra)
    while len(nodeports) < 16:  # long enough to be indexed by port
        nodeports.append(
            f"-A KUBE-NODEPORTS -p tcp -m tcp --dport {31000 + len(nodeports)} -j KUBE-MARK-MASQ"
        )
    top.append("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS")
    nat = [
        "*nat",
        ":PREROUTING ACCEPT [0:0]",
        ":INPUT ACCEPT [0:0]",
        ":OUTPUT ACCEPT [0:0]",
        ":POSTROUTING ACCEPT [0:0]",
        *chains,
        '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        "-A POSTROUTING -j KUBE-POSTROUTING",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000",
        "-A KUBE-POSTROUTING -j MASQUERADE --random-fully",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
        "-A KUBE-EXTRA -j MARK --set-xmark 0x2/0x2",
        *own,
        *top,
        *nodeports,
        "COMMIT",
    ]
    filt = [
        "*filter",
        ":INPUT ACCEPT [0:0]",
        ":FORWARD ACCEPT [0:0]",
        ":OUTPUT ACCEPT [0:0]",
        ":KUBE-FORWARD - [0:0]",
        "-A FORWARD -j KUBE-FORWARD",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        "-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT",
        "-A INPUT -p udp -m udp --dport 9 -j REJECT",
        "COMMIT",
    ]
    return KubeRuleset("\n".join(nat + filt) + "\n", tuple(vips), tuple(ports), tuple(node_ports))


def packets_for(rules: KubeRuleset) -> st.SearchStrategy[Packet]:
    """Packets aimed mostly at the ruleset's keys: its services, node ports and the node."""
    dst = st.one_of(
        st.sampled_from(rules.vips), st.sampled_from([NODE_IP, "10.0.1.1", "203.0.113.9", "172.30.0.250"])
    )
    dport = st.one_of(
        st.sampled_from(rules.ports),
        st.sampled_from(rules.node_ports or (30000,)),
        st.sampled_from([0, 1, 9, 80, 30001, 30002, 65535]),
    )
    source = st.sampled_from(
        [
            ("203.0.113.2", "eth0"),
            ("10.0.1.1", "cni0"),
            ("10.0.7.7", "cni0"),
            (NODE_IP, None),
            ("127.0.0.1", None),
        ]
    )
    return st.builds(
        lambda s, d, sport, dp, proto, mark, syn: Packet(
            src=s[0], dst=d, sport=sport, dport=dp, protocol=proto, in_interface=s[1], mark=mark, syn=syn
        ),
        source,
        dst,
        st.sampled_from([1, 1024, 40000, 65535]),
        dport,
        st.sampled_from(["tcp", "tcp", "udp", "icmp"]),
        st.sampled_from([0, 0, 1, 0x4000]),
        st.booleans(),
    )
