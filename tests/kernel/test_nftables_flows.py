"""Real TCP and UDP through an nftables ruleset loaded with ``nft -f`` in a namespace node:
the emulator predicts which endpoint answers, the source it sees, and the rule counters."""

from __future__ import annotations

import random
import re
import tempfile
from collections.abc import Iterator

import pytest

from emulation import ManualClock, Packet
from emulation.nftables import canonical, load
from emulation.nftables.netns import Netns
from tests.conftest import require_kernel
from tests.emulation.nftables.rulesets import flows_ruleset
from tests.kernel.harness import PROBE_BYTES, Answer, Probe, Topology, topology
from tests.kernel.netns import sh
from tests.scenarios import (
    CLIENT_GW,
    EP_PORT,
    EXTERNAL,
    NODE_IP,
    PA,
    PB,
    POD_CLIENT,
    REMOTE,
    node_model,
)

pytestmark = pytest.mark.kernel

RULES = flows_ruleset(pa=PA, pb=PB, remote=REMOTE, port=EP_PORT, nodeport_ip=CLIENT_GW)
#: (namespace key, source, in_interface on the node, destination, port, protocol, attempts)
FLOWS = (
    ("client", EXTERNAL, "eth0", "172.30.0.41", 80, "tcp", 6),
    ("pc", POD_CLIENT, "vp3", "172.30.0.41", 80, "tcp", 6),
    ("client", EXTERNAL, "eth0", "172.30.0.42", 53, "udp", 2),
    ("pc", POD_CLIENT, "vp3", "172.30.0.42", 53, "udp", 2),
    ("client", EXTERNAL, "eth0", "172.30.0.43", 80, "tcp", 2),
    ("client", EXTERNAL, "eth0", "172.30.0.99", 80, "tcp", 1),
    ("client", EXTERNAL, "eth0", "172.30.0.41", 81, "tcp", 1),
    ("client", EXTERNAL, "eth0", CLIENT_GW, 3001, "tcp", 4),
    ("pc", POD_CLIENT, "vp3", "172.30.0.44", 80, "tcp", 2),
    ("node", NODE_IP, None, "172.30.0.41", 80, "tcp", 4),
    ("node", NODE_IP, None, "172.30.0.44", 80, "tcp", 2),
)


@pytest.fixture(scope="module")
def node() -> Iterator[Topology]:
    """The topology with the ruleset loaded into the node namespace by ``nft -f``."""
    require_kernel("nft")
    with topology() as topo, tempfile.NamedTemporaryFile("w", suffix=".nft") as f:
        f.write(RULES)
        f.flush()
        sh("ip", "netns", "exec", topo.names["node"], "nft", "-f", f.name)
        yield topo


def _packet(src: str, iif: str | None, dst: str, port: int, proto: str, sport: int) -> Packet:
    length = 20 + 8 + PROBE_BYTES if proto == "udp" else 60  # a Linux SYN: 20 + 40 (options)
    return Packet(src=src, dst=dst, sport=sport, dport=port, protocol=proto, in_interface=iif, length=length)  # type: ignore[arg-type]


def _predicted(ns: Netns, packet: Packet) -> set[Answer]:
    out = set()
    for _, o in ns.enumerate(packet):
        if o.verdict == "ACCEPT":
            out.add(Answer(kind="ACCEPT", endpoint=o.destination, peer=o.packet.src))
        else:
            out.add(Answer(kind=str(o.verdict), endpoint=None, peer=None))
    return out


def _kernel_counters(listing: str) -> list[tuple[int, int]]:
    return [(int(p), int(b)) for p, b in re.findall(r"counter packets (\d+) bytes (\d+)", listing)]


def test_emulator_predicts_endpoint_source_and_counters(node: Topology) -> None:
    """Every real answer is one the emulator predicts (endpoint and the source it saw), every
    predicted endpoint of a two-endpoint service is reachable, and the counters agree."""
    probes = [
        Probe(
            ns=key,
            src=src,
            dst=dst,
            port=port,
            proto=proto,
            count=n,
            timeout_s=0.5 if dst.endswith(".99") else 2.0,
        )
        for key, src, _, dst, port, proto, n in FLOWS
    ]
    answers = node.probe(probes)
    emu = Netns(node_model(), ManualClock(), ruleset=load(RULES))
    rng = random.Random(7)
    for (key, src, iif, dst, port, proto, n), got in zip(FLOWS, answers, strict=True):
        predicted = _predicted(emu, _packet(src, iif, dst, port, proto, 40000))
        for answer in got:
            assert answer in predicted, (
                f"{key} {src} -> {dst}:{port}/{proto}: kernel {answer}, emulator {predicted}"
            )
        for i in range(n):
            emu.send(
                _packet(
                    src,
                    iif,
                    dst,
                    port,
                    proto,
                    41000 + i + 100 * FLOWS.index((key, src, iif, dst, port, proto, n)),
                ),
                rng,
            )
    kernel = sh("ip", "netns", "exec", node.names["node"], "nft", "list", "ruleset").stdout
    counted = _kernel_counters(kernel)
    assert all(p > 0 for p, _ in counted), counted  # every counter saw packets: the check has teeth
    assert _kernel_counters(canonical(emu.list_ruleset())) == _kernel_counters(canonical(kernel))
    assert canonical(emu.list_ruleset()) == canonical(kernel)


def test_two_endpoint_service_reaches_both_endpoints(node: Topology) -> None:
    """The emulator's two outcomes of the numgen split are the two endpoints the kernel answers from."""
    emu = Netns(node_model(), ManualClock(), ruleset=load(RULES))
    outcomes = emu.enumerate(_packet(POD_CLIENT, "vp3", "172.30.0.41", 80, "tcp", 40000))
    assert sorted((p, o.destination) for p, o in outcomes) == [
        (0.5, f"{PA}:{EP_PORT}"),
        (0.5, f"{PB}:{EP_PORT}"),
    ]
    (got,) = node.probe([Probe(ns="pc", src=POD_CLIENT, dst="172.30.0.41", port=80, count=24)])
    assert {a.endpoint for a in got} == {f"{PA}:{EP_PORT}", f"{PB}:{EP_PORT}"}
