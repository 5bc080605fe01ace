# ruff: noqa: E501  (cluster literals and test names are kept whole to stay readable)
"""How a comparison is shown: wrapped columns, traces with input lines, the uncertain share."""

from __future__ import annotations

from emulation.netfilter import load
from kproxy.testing import Cluster, Outcome, Packet, Verdict, compare
from kproxy.testing.equivalence import Comparison, format_comparison
from kproxy.testing.modes import DumpAdapter
from tests.scenarios import cluster
from tests.unit.cli.test_verify import NODE, _node_dump

LONG_WHY = "no Service at 2001:db8:ffff::2: not proxied, routed as the node routes it onwards unchanged"


def test_a_long_why_is_wrapped_not_cut_mid_word() -> None:
    """A "why" longer than its column is wrapped at spaces, every word shown whole, no line over the column."""
    c = Cluster(manifests=())
    packet = Packet(src="10.0.0.5", dst="10.96.0.1", sport=40000, dport=80)
    outcomes = {m: Outcome(mode=m, verdict=Verdict.ACCEPT, summary=LONG_WHY) for m in ("a", "b")}
    text = format_comparison(Comparison(cluster=c, packet=packet, outcomes=outcomes, excused=(), mismatches=()))
    table = text.split("\n\n")[1].splitlines()
    cells = [cell for row in table[2:] for cell in (row[:58].strip(), row[60:].strip())]
    words = " ".join(cells).split()
    assert all(w in words for w in ("why:", *LONG_WHY.split()))
    assert all(len(row) <= 58 * 2 + 2 for row in table)


def test_describe_says_where_the_rest_went() -> None:
    """An outcome whose endpoints have half the connections shows the uncertain other half ("uncertain: 0.5")."""
    lines = Outcome(mode="m", verdict=Verdict.ACCEPT, endpoints={"10.0.0.5:80": 0.5}, uncertain=0.5).describe()
    assert any(line.split() == ["uncertain:", "0.5"] for line in lines)
    lines = Outcome(mode="m", verdict=Verdict.ACCEPT, endpoints={"10.0.0.5:80": 0.25}).describe()
    assert any(line.split() == ["not", "translated:", "0.75"] for line in lines)


def test_traces_show_input_lines_and_unknown_steps() -> None:
    """A traced comparison gives each rule's line in the dump and marks a match the emulator does not model UNKNOWN."""
    c = Cluster(manifests=tuple(cluster()), node=NODE)
    lines = _node_dump().splitlines()
    at = next(i for i, line in enumerate(lines) if "-A KUBE-SERVICES" in line and "filter" not in line)
    lines.insert(at, "-A KUBE-SERVICES -m bpf --bytecode 1 -j RETURN")
    dump = DumpAdapter(load("\n".join(lines) + "\n", version=4, strict=False))
    info = next(iter(c.snapshot))
    packet = Packet(src="10.0.0.5", dst=info.cluster_ip, sport=40000, dport=info.port, protocol=info.protocol, origin="local-pod")
    trace = compare(c, packet, ["iptables", dump], trace=True).outcomes["node-dump"].trace
    assert any(f"(line {at + 1}): UNKNOWN -A KUBE-SERVICES -m bpf" in t for t in trace)
    assert any(t.startswith("outcome p=1 ACCEPT") for t in trace)
