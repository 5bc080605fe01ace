# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""A real node in network namespaces, for checking the emulator against the kernel.

Builds the topology of :mod:`tests.scenarios` (a node namespace, pods on it, a second
node holding a pod "elsewhere", an external client), joined by veth pairs; sets the sysctls
kube-proxy needs in the node (``route_localnet``, ``ip_forward``, no ICMP rate limit, relaxed
``rp_filter``); starts a TCP+UDP identity server in each pod (it answers with its endpoint and the
client address it saw) and a TCP one on the health check node port in the node; and sends
probes from any namespace with a small prober process (one process per namespace and batch,
probes run concurrently in it, every attempt bounded by a timeout).

:func:`topology6` builds the same shape for IPv6 only (see :data:`V6`): ULA addresses, pods
reached through a link-local gateway on their veth (as Calico routes IPv6 pods), duplicate
address detection off (``accept_dad=0`` and ``nodad``, so addresses are usable at once) and
IPv6 forwarding on in the node. Servers and probers pick the socket family from the address.

Only traffic between these namespaces is ever sent. Everything is deleted on exit, also after a
failure; namespaces left by an earlier killed run are deleted first.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from kproxy.kernel import LinuxNetfilter
from kproxy.model.names import IPFamily
from tests.kernel.netns import cleanup_stale, netns, sh
from tests.scenarios import (
    BLOCKED,
    CLIENT_GW,
    EP_PORT,
    EXTERNAL,
    HEALTH_PORT,
    NODE2_IP,
    NODE_IP,
    PA,
    PB,
    POD_CLIENT,
    POD_GW,
    POD_LINKS,
    REMOTE,
)

#: Bytes of every identity server's UDP answer (padded), so byte counters are predictable.
REPLY_BYTES = 128
#: Bytes of the prober's UDP datagram payload.
PROBE_BYTES = 16

_SERVER = r"""
import json, socket, sys, threading
ip, port, name, udp = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "udp"
fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
def tcp_loop(s):
    while True:
        c, peer = s.accept()
        try:
            c.sendall(json.dumps({"ep": name, "peer": peer[0]}).encode())
        finally:
            c.close()
def udp_loop(u):
    while True:
        data, peer = u.recvfrom(2048)
        body = json.dumps({"ep": name, "peer": peer[0]}).encode()
        u.sendto(body + b" " * (REPLY - len(body)), peer)
s = socket.socket(fam); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((ip, port)); s.listen(256)
threading.Thread(target=tcp_loop, args=(s,), daemon=True).start()
if udp:
    u = socket.socket(fam, socket.SOCK_DGRAM); u.bind((ip, port))
    threading.Thread(target=udp_loop, args=(u,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
""".replace("REPLY", str(REPLY_BYTES))

_PROBER = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
probes = json.load(sys.stdin)
def attempt(p, i):
    udp = p["proto"] == "udp"
    fam = socket.AF_INET6 if ":" in p["dst"] else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_DGRAM if udp else socket.SOCK_STREAM)
    s.settimeout(p["timeout"])
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((p["src"], p["sport"] + i if p["sport"] else 0))
        s.connect((p["dst"], p["port"]))
        if udp:
            s.send(b"x" * PROBE)
        d = json.loads(s.recv(4096).decode())
        return ["ACCEPT", d["ep"], d["peer"]]
    except ConnectionRefusedError:
        return ["REJECT", None, None]
    except (socket.timeout, TimeoutError):
        return ["DROP", None, None]
    except PermissionError:
        return ["EPERM", None, None]
    except OSError as e:
        return ["ERROR", repr(e), None]
    finally:
        s.close()
def run(p):
    return [attempt(p, i) for i in range(p["count"])]
with ThreadPoolExecutor(max_workers=16) as pool:
    print(json.dumps(list(pool.map(run, probes))))
""".replace("PROBE", str(PROBE_BYTES))


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """Connections (TCP) or datagrams (UDP) from one source to one destination.

    Attributes:
        ns: the namespace key to send from (``node``, ``client``, ``pa``, ``pb``, ``pc``).
        src: the source address to bind.
        dst, port, proto: the destination.
        count: how many attempts, each a new flow (a new source port).
        timeout_s: how long one attempt may wait for its answer.
        sport: the first source port (then +1 per attempt); 0 lets the kernel choose.
    """

    ns: str
    src: str
    dst: str
    port: int
    proto: str = "tcp"
    count: int = 1
    timeout_s: float = 1.0
    sport: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One attempt's result: ``kind`` ACCEPT/REJECT/DROP/EPERM/ERROR, the endpoint that answered
    and the client address it saw (both None unless answered).

    REJECT is ECONNREFUSED (an ICMP port unreachable, or a TCP RST), DROP a timeout; EPERM is
    what a UDP socket on the node itself gets when netfilter drops or rejects its datagram in
    OUTPUT (``ip_local_out`` fails and ``send`` reports it; TCP ignores that error in
    ``tcp_connect`` and waits for the ICMP error or retransmits).
    """

    kind: str
    endpoint: str | None
    peer: str | None


class Topology:
    """The namespaces; built by :func:`topology` (or :func:`topology6`). ``names[key]`` is a
    namespace's real name; :attr:`kernel` programs the node's ``iptables`` (or ``ip6tables``)."""

    def __init__(self, names: dict[str, str], family: IPFamily = IPFamily.IPv4) -> None:
        self.names = names
        self.family = family
        self.kernel = LinuxNetfilter(family, netns=names["node"], timeout_s=30.0)

    def probe(self, probes: Sequence[Probe]) -> list[list[Answer]]:
        """Send every probe (one prober per namespace, all namespaces at once); answers in order."""
        by_ns: dict[str, list[int]] = {}
        for i, p in enumerate(probes):
            by_ns.setdefault(p.ns, []).append(i)
        procs = {}
        for key, idx in by_ns.items():
            payload = json.dumps(
                [
                    {
                        "src": probes[i].src,
                        "dst": probes[i].dst,
                        "port": probes[i].port,
                        "proto": probes[i].proto,
                        "count": probes[i].count,
                        "timeout": probes[i].timeout_s,
                        "sport": probes[i].sport,
                    }
                    for i in idx
                ]
            )
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.names[key], sys.executable, "-c", _PROBER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            procs[key] = (proc, payload)
        out: list[list[Answer]] = [[] for _ in probes]
        for key, (proc, payload) in procs.items():
            stdout, stderr = proc.communicate(payload, timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"prober in {key} failed: {stderr}")
            for i, answers in zip(by_ns[key], json.loads(stdout), strict=True):
                out[i] = [Answer(kind=a[0], endpoint=a[1], peer=a[2]) for a in answers]
        return out


def _link(
    ns_a: str,
    dev_a: str,
    addr_a: str | None,
    ns_b: str,
    dev_b: str,
    addr_b: str | None,
    *,
    nodad: bool = False,
) -> None:
    """A veth pair between two namespaces, addressed and up (``nodad``: IPv6, no DAD wait)."""
    sh("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
    for ns, dev, addr in ((ns_a, dev_a, addr_a), (ns_b, dev_b, addr_b)):
        if addr:
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev, *(("nodad",) if nodad else ()))
        sh("ip", "-n", ns, "link", "set", dev, "up")


def _sysctl(ns: str, *settings: str) -> None:
    sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", *settings)


def _server(stack: ExitStack, ns: str, ip: str, port: int, name: str, udp: bool) -> None:
    proc = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            ns,
            sys.executable,
            "-u",
            "-c",
            _SERVER,
            ip,
            str(port),
            name,
            "udp" if udp else "tcp",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def stop() -> None:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    stack.callback(stop)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(
            f"identity server {name} in {ns} did not start: {proc.stderr.read() if proc.stderr else ''}"
        )


@contextmanager
def topology() -> Iterator[Topology]:
    """Build the namespaces, links, routes, sysctls and servers; tear everything down after."""
    cleanup_stale()
    with ExitStack() as stack:
        names = {key: stack.enter_context(netns(key)) for key in ("node", "client", "n2", "pa", "pb", "pc")}
        node = names["node"]
        _sysctl(
            node,
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.route_localnet=1",
            "net.ipv4.icmp_ratelimit=0",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        )
        # The external client, with an allowed and a blocked source address.
        _link(node, "eth0", f"{CLIENT_GW}/24", names["client"], "eth0", f"{EXTERNAL}/24")
        sh("ip", "-n", names["client"], "addr", "add", f"{BLOCKED}/24", "dev", "eth0")
        sh("ip", "-n", names["client"], "route", "add", "default", "via", CLIENT_GW)
        # The other node, holding the remote pod on its lo.
        _link(node, "eth1", f"{NODE_IP}/24", names["n2"], "eth0", f"{NODE2_IP}/24")
        sh("ip", "-n", names["n2"], "addr", "add", f"{REMOTE}/32", "dev", "lo")
        sh("ip", "-n", names["n2"], "route", "add", "default", "via", NODE_IP)
        sh("ip", "-n", node, "route", "add", "10.180.1.0/24", "via", NODE2_IP, "dev", "eth1")
        sh("ip", "-n", node, "route", "add", "default", "via", NODE2_IP, "dev", "eth1")
        # Pods on this node, routed as Calico does (a /32 and a link-local gateway).
        for key, ip in (("pa", PA), ("pb", PB), ("pc", POD_CLIENT)):
            dev = POD_LINKS[ip]
            _link(node, dev, f"{POD_GW}/32", names[key], "eth0", f"{ip}/32")
            sh("ip", "-n", names[key], "route", "add", POD_GW, "dev", "eth0", "scope", "link")
            sh("ip", "-n", names[key], "route", "add", "default", "via", POD_GW, "dev", "eth0")
            sh("ip", "-n", node, "route", "add", f"{ip}/32", "dev", dev)
        for dev in ("eth0", "eth1", *POD_LINKS.values()):
            _sysctl(node, f"net.ipv4.conf.{dev}.rp_filter=0")
        for key, ip in (("pa", PA), ("pb", PB), ("n2", REMOTE)):
            _server(stack, names[key], ip, EP_PORT, f"{ip}:{EP_PORT}", udp=True)
        _server(stack, node, "0.0.0.0", HEALTH_PORT, f"node:{HEALTH_PORT}", udp=False)
        yield Topology(names)


# -- IPv6 ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan6:
    """The addresses of :func:`topology6`, the IPv6 twin of the IPv4 plan.

    Attributes:
        client_gw, external, blocked: the node's address towards the external client, and the
            client's two addresses (``blocked`` lies outside ``fd00:ff::/121``, the source range
            a test can allow, as 203.0.113.130 lies outside 203.0.113.0/25).
        node_ip, node2_ip: this node's and the other node's addresses on their shared link.
        pod_gw: the link-local gateway on the node side of every pod veth (Calico uses
            ``fe80::ecee:eeff:feee:eeee``); the node has no global address on those veths.
        pod_client, pa, pb: pods on this node (the client pod, and two endpoints).
        remote, remote_pods: the other node's pod (on its ``lo``) and its pod range.
        cluster_cidr: the pod CIDR holding all of them (``--cluster-cidr``).
        links: the node's veth towards each pod.
    """

    client_gw: str = "fd00:ff::1"
    external: str = "fd00:ff::2"
    blocked: str = "fd00:ff::82"
    node_ip: str = "fd00:1::2"
    node2_ip: str = "fd00:1::3"
    pod_gw: str = "fe80::1"
    pod_client: str = "fd00:10::2"
    pa: str = "fd00:10:180::1"
    pb: str = "fd00:10:180::2"
    remote: str = "fd00:10:181::1"
    remote_pods: str = "fd00:10:181::/64"
    cluster_cidr: str = "fd00:10::/48"
    links: tuple[tuple[str, str], ...] = (
        ("fd00:10:180::1", "vp1"),
        ("fd00:10:180::2", "vp2"),
        ("fd00:10::2", "vp3"),
    )


#: The IPv6 address plan.
V6 = Plan6()

_NO_DAD = ("net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")


def endpoint_name(ip: str, port: int) -> str:
    """How an identity server names itself: ``ip:port``, ``[ip]:port`` for IPv6 (as the
    emulator's :attr:`~emulation.netfilter.Outcome.destination` writes it)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@contextmanager
def topology6(extra_servers: Sequence[tuple[str, str, int, str, bool]] = ()) -> Iterator[Topology]:
    """:func:`topology` for IPv6 (:data:`V6`); the node's :attr:`Topology.kernel` uses ip6tables.

    Each namespace gets ``accept_dad=0`` (all and default) before its links exist and every
    address is added ``nodad``; the node forwards IPv6 and has no ICMPv6 rate limit. Identity
    servers (TCP+UDP) run on ``pa``, ``pb`` and the remote pod, port :data:`EP_PORT`; a TCP one
    on the node's health check node port. ``extra_servers`` are more, as ``(namespace key,
    ip, port, name, udp)``.
    """
    cleanup_stale()
    with ExitStack() as stack:
        names = {
            key: stack.enter_context(netns(f"{key}6")) for key in ("node", "client", "n2", "pa", "pb", "pc")
        }
        for ns in names.values():
            _sysctl(ns, *_NO_DAD)
        node = names["node"]
        _sysctl(node, "net.ipv6.conf.all.forwarding=1", "net.ipv6.icmp.ratelimit=0")
        _link(node, "eth0", f"{V6.client_gw}/64", names["client"], "eth0", f"{V6.external}/64", nodad=True)
        sh("ip", "-n", names["client"], "addr", "add", f"{V6.blocked}/64", "dev", "eth0", "nodad")
        sh("ip", "-n", names["client"], "-6", "route", "add", "default", "via", V6.client_gw)
        _link(node, "eth1", f"{V6.node_ip}/64", names["n2"], "eth0", f"{V6.node2_ip}/64", nodad=True)
        sh("ip", "-n", names["n2"], "addr", "add", f"{V6.remote}/128", "dev", "lo", "nodad")
        sh("ip", "-n", names["n2"], "-6", "route", "add", "default", "via", V6.node_ip)
        sh("ip", "-n", node, "-6", "route", "add", V6.remote_pods, "via", V6.node2_ip, "dev", "eth1")
        sh("ip", "-n", node, "-6", "route", "add", "default", "via", V6.node2_ip, "dev", "eth1")
        for key, (ip, dev) in zip(("pa", "pb", "pc"), V6.links, strict=True):
            _link(node, dev, f"{V6.pod_gw}/64", names[key], "eth0", f"{ip}/128", nodad=True)
            sh("ip", "-n", names[key], "-6", "route", "add", "default", "via", V6.pod_gw, "dev", "eth0")
            sh("ip", "-n", node, "-6", "route", "add", f"{ip}/128", "dev", dev)
        for key, ip in (("pa", V6.pa), ("pb", V6.pb), ("n2", V6.remote)):
            _server(stack, names[key], ip, EP_PORT, endpoint_name(ip, EP_PORT), udp=True)
        _server(stack, node, "::", HEALTH_PORT, f"node:{HEALTH_PORT}", udp=False)
        for key, ip, port, name, udp in extra_servers:
            _server(stack, names[key], ip, port, name, udp=udp)
        yield Topology(names, IPFamily.IPv6)


# -- counters -----------------------------------------------------------------------------------

#: A counter's place in ``iptables-save -c``: (table, chain, rule index from 1; 0 for the policy).
CounterKey = tuple[str, str, int]


def parse_counters(save: str) -> dict[CounterKey, tuple[int, int]]:
    """``{(table, chain, index): (packets, bytes)}`` of ``iptables-save -c`` text; a built-in
    chain's policy counter is index 0 (user chains have none)."""
    out: dict[CounterKey, tuple[int, int]] = {}
    table, index = "", dict[str, int]()
    for line in save.splitlines():
        if line.startswith("*"):
            table, index = line[1:], {}
        elif line.startswith(":"):
            name, policy, counters = line[1:].split()
            if policy != "-":
                p, b = counters.strip("[]").split(":")
                out[(table, name, 0)] = (int(p), int(b))
        elif line.startswith("["):
            counters, _, chain = line.split()[:3]
            index[chain] = index.get(chain, 0) + 1
            p, b = counters.strip("[]").split(":")
            out[(table, chain, index[chain])] = (int(p), int(b))
    return out


_LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def netns_socket(ns: str, kind: int = socket.SOCK_RAW, proto: int = 0) -> socket.socket:
    """An IPv4 socket of ``kind`` (raw by default, of protocol ``proto``) in the namespace ``ns``.

    A socket belongs to the network namespace of the thread that creates it, and ``setns(2)``
    with ``CLONE_NEWNET`` moves only the calling thread: a short-lived thread enters ``ns``
    (``/run/netns/<ns>``, where ``ip netns add`` mounts it) and opens the socket there; the
    test's own threads never change namespace.
    """
    box: list[socket.socket | BaseException] = []

    def enter_and_open() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _LIBC.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            box.append(socket.socket(socket.AF_INET, kind, proto))
        except BaseException as e:  # handed to the caller
            box.append(e)

    thread = threading.Thread(target=enter_and_open, name=f"open-in-{ns}", daemon=True)
    thread.start()
    thread.join(timeout=10)
    if not box:
        raise RuntimeError(f"opening a socket in {ns} did not finish")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]
