# ruff: noqa: E501  (long command lines are kept whole to stay readable)
"""``kproxy verify``: modes compared on generated packets; a node's dump compared by behaviour."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from emulation import ManualClock
from emulation.netfilter import Netns, Ruleset
from kproxy.cli.main import main
from kproxy.kernel.emulated import EmulatedNetfilter
from kproxy.model import IPFamily
from kproxy.modes.iptables import IptablesRenderer
from kproxy.modes.iptables.mode import load_now
from kproxy.testing import Cluster, NodeSpec, Outcome, Verdict, emulated_node
from kproxy.testing import modes as modes_module
from kproxy.testing.modes import iptables_config
from tests.scenarios import cluster

FLAGS = ["--hostname-override", "node-a", "--node-ip", "192.168.0.2", "--cluster-cidr", "10.0.0.0/8"]
NODE = NodeSpec(hostname="node-a", node_ips=("192.168.0.2",), cluster_cidrs=("10.0.0.0/8",),
                local_pod_cidrs=("10.0.0.0/24",), families=(IPFamily.IPv4,))


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster()}))
    return path


def _node_dump() -> str:
    """What a node running kube-proxy for the scenario cluster would print with ``iptables-save -c``."""
    c = Cluster(manifests=tuple(cluster()), node=NODE)
    netns = Netns(emulated_node(NODE), ManualClock(), ruleset=Ruleset(4))
    load_now(EmulatedNetfilter(netns, IPFamily.IPv4), IptablesRenderer(iptables_config(c, IPFamily.IPv4)).render(c.snapshot))
    return netns.save(counters=True)


def _with_docker(dump: str) -> str:
    """``dump`` with another component's chains and rules, as a real node has them."""
    dump = dump.replace("*filter\n", "*filter\n:DOCKER - [0:0]\n", 1)
    dump = dump.replace("\nCOMMIT\n", "\n-A FORWARD -o docker0 -j DOCKER\n-A DOCKER -d 172.17.0.2/32 -p tcp -m tcp --dport 80 -j ACCEPT\nCOMMIT\n", 1)
    return dump


def test_modes_agree_on_the_scenario_cluster(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """userspace and iptables agree (known differences named) and verify exits 0."""
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--examples", "150"]) == 0
    out = capsys.readouterr().out
    assert "agree on 150 packets" in out and "external-traffic-not-served-by-userspace" in out


def test_a_disagreeing_mode_exits_1_with_the_minimal_packet(
        manifests: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A mode that drops everything is reported with a shrunk packet and both outcomes side by side."""

    class Dropper:
        name = "dropper"

        def outcome(self, cluster: Cluster, packet: object, *, trace: bool = False) -> Outcome:
            return Outcome(mode=self.name, verdict=Verdict.DROP, summary="drops everything", trace=("DROP",))

        def connections(self, cluster: Cluster, packet: object, times_s: object) -> list[str | None]:
            return []

    monkeypatch.setitem(modes_module._REGISTRY, "dropper", Dropper)
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--modes", "iptables,dropper", "--examples", "50"]) == 1
    out = capsys.readouterr().out
    assert "iptables and dropper disagree" in out and "MISMATCH: iptables and dropper disagree on verdict" in out
    assert "trace of dropper:" in out and re.search(r"packet: TCP .* -> ", out)


def test_a_node_dump_with_other_rules_and_renamed_chains_agrees(
        manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Counters, another component's rules and consistently renamed chains are not differences."""
    dump = _with_docker(_node_dump())
    for chain in sorted(set(re.findall(r"KUBE-SVC-[A-Z0-9]+", dump))):
        dump = dump.replace(chain, chain.replace("KUBE-SVC-", "KUBE-SVC-X"))
    path = tmp_path / "node.iptables-save"
    path.write_text(dump)
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--iptables-save", str(path), "--examples", "150"]) == 0
    assert "iptables, node-dump agree" in capsys.readouterr().out


def test_a_node_dump_missing_an_endpoint_disagrees(
        manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dump whose Service chain lost an endpoint rule sends packets elsewhere: exit 1."""
    lines = _node_dump().splitlines()
    svc = next(line for line in lines if line.startswith("[") and "KUBE-SVC-" in line and "--probability 0.5" in line)
    path = tmp_path / "node.iptables-save"
    path.write_text("\n".join(line for line in lines if line != svc) + "\n")
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--iptables-save", str(path), "--examples", "300"]) == 1
    assert "MISMATCH: iptables and node-dump disagree on endpoints" in capsys.readouterr().out


def test_a_node_dump_missing_its_affinity_rcheck_rules_disagrees_on_session_affinity(
        manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dump whose `-m recent --rcheck` rules were deleted spreads first packets exactly as the right one
    does, so the packet pass agrees; a client's second connection goes elsewhere, and verify exits 1 naming it."""
    lines = _node_dump().splitlines()
    kept = [line for line in lines if "--rcheck" not in line]
    assert len(kept) < len(lines)
    path = tmp_path / "node.iptables-save"
    path.write_text("\n".join(kept) + "\n")
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--iptables-save", str(path), "--examples", "60"]) == 1
    out = capsys.readouterr().out
    assert "disagree on sessionAffinity" in out
    assert re.search(r"node-dump: sessionAffinity ClientIP of ns5/svc5:p80 \(timeoutSeconds 10800\) did not hold: "
                     r"12 connections from \S+ within 11 s went to ", out)
    assert "  iptables:" not in out  # the rendered rules keep it


def test_verify_says_how_many_affinity_clients_it_checked(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On the scenario cluster every mode keeps each affinity client on one endpoint, and the summary says so."""
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--examples", "20"]) == 0
    assert re.search(r"sessionAffinity held for [1-9]\d* clients x 12 connections", capsys.readouterr().out)


def test_an_unknown_mode_is_a_usage_error(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--modes naming no registered mode exits 2 and lists the available ones."""
    assert main(["verify", "--manifests", str(manifests), "--modes", "userspace,nope"]) == 2
    assert "unknown mode 'nope'" in capsys.readouterr().err


def test_a_bad_cluster_cidr_is_a_usage_error(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--cluster-cidr that is not a CIDR exits 2 naming the flag."""
    assert main(["verify", "--manifests", str(manifests), "--cluster-cidr", "nope"]) == 2
    assert "--cluster-cidr" in capsys.readouterr().err


DUAL_STACK = """\
apiVersion: v1
kind: Service
metadata: {namespace: ns, name: web}
spec:
  type: NodePort
  clusterIPs: [10.96.0.10, "fd00:10:96::10"]
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.244.1.5], nodeName: node-b}]
ports: [{name: http, port: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {namespace: ns, name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
endpoints: [{addresses: ["fd00:10:244:1::5"], nodeName: node-b}]
ports: [{name: http, port: 8080}]
"""


def test_an_ipv4_only_node_checks_only_ipv4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With an IPv4 --node-ip only, a dual-stack Service is checked in IPv4 only, and the output says so."""
    path = tmp_path / "ds.yaml"
    path.write_text(DUAL_STACK)
    assert main(["verify", "--manifests", str(path), "--hostname-override", "node-a", "--node-ip", "192.168.0.2", "--examples", "200"]) == 0
    assert "families checked: IPv4;" in capsys.readouterr().out


def test_a_missing_manifest_path_exits_2_without_a_fatal_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --manifests path that does not exist is an input error: exit 2, a plain message, no "fatal" log line."""
    assert main(["verify", "--manifests", str(tmp_path / "nope.yaml")]) == 2
    captured = capsys.readouterr()
    assert "kproxy: --manifests:" in captured.err and "fatal" not in captured.err + captured.out


@pytest.mark.parametrize("content", ["x: [\n", "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n", ""])
def test_manifests_with_problems_or_no_ports_refuse_to_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str) -> None:
    """A YAML error, a nameless Service or an empty file exits 2 saying why, not "agree"; --allow-problems checks anyway."""
    path = tmp_path / "c.yaml"
    path.write_text(content)
    assert main(["verify", "--manifests", str(path), *FLAGS, "--examples", "5"]) == 2
    captured = capsys.readouterr()
    assert "refusing to check" in captured.err and "agree" not in captured.out
    assert main(["verify", "--manifests", str(path), *FLAGS, "--examples", "5", "--allow-problems"]) == 0


def test_an_empty_dump_exits_2(manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty --iptables-save file is an input error (exit 2), not a disagreement."""
    path = tmp_path / "empty"
    path.write_text("")
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--iptables-save", str(path)]) == 2
    assert "empty" in capsys.readouterr().err


def test_an_unreadable_dump_exits_2(manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An --iptables-save path that cannot be read (a folder) exits 2 naming the flag."""
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--iptables-save", str(tmp_path)]) == 2
    assert "--iptables-save: cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["verify", "trace"])
def test_a_binary_dump_is_not_utf8_text(manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Binary --iptables-save content exits 2 with "not UTF-8 text", in verify and in trace, without a traceback."""
    path = tmp_path / "dump.bin"
    path.write_bytes(b"\xff\xfe\x00*nat\n\x80\x81")
    argv = (["verify", "--manifests", str(manifests), *FLAGS] if command == "verify"
            else ["trace", "--src", "10.0.0.5", "--dst", "10.96.0.10:80"])
    assert main([*argv, "--iptables-save", str(path)]) == 2
    assert f"kproxy: --iptables-save {path}: not UTF-8 text (" in capsys.readouterr().err


def test_a_rendered_dump_is_refused_with_the_reason(manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kproxy render` output (KUBE chains, no jump into KUBE-SERVICES) exits 2 saying it lacks the jump rules."""
    path = tmp_path / "render.txt"
    assert main(["render", "--manifests", str(manifests), "--proxy-mode", "iptables", *FLAGS]) == 0
    path.write_text(capsys.readouterr().out)
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--iptables-save", str(path)]) == 2
    assert "the dump has no jump rules into KUBE-SERVICES: was it made with `kproxy render`?" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--modes", ",,"], ["--modes", "userspace", "--iptables-save", "x"]])
def test_empty_or_ignored_modes_are_usage_errors(manifests: Path, capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    """--modes naming nothing, or given with --iptables-save (where it would be ignored), exits 2 naming --modes."""
    assert main(["verify", "--manifests", str(manifests), *FLAGS, *extra]) == 2
    assert "--modes" in capsys.readouterr().err


def test_several_node_ips_of_a_family_are_accepted_the_first_primary(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two --node-ip of one family (as kube-proxy's fixtures have) are checked, the first as the primary IP."""
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--node-ip", "192.168.1.2", "--examples", "100"]) == 0
    assert "agree on 100 packets" in capsys.readouterr().out


def test_node_spec_keeps_every_node_ip_and_puts_the_secondary_on_eth0() -> None:
    """The verify node's primary IP is the first of the family; the second is an address of eth0 too."""
    from kproxy.config import Command, build_run_config
    from kproxy.testing import emulated_node

    run = build_run_config({"--node-ip": ["192.168.0.2", "192.168.1.2"], "--hostname-override": "node-a"},
                           command=Command.VERIFY)
    spec = NodeSpec.from_run(run)
    assert spec.node_ip(4) == "192.168.0.2" and spec.node_ips == ("192.168.0.2", "192.168.1.2")
    eth0 = next(i for i in emulated_node(spec).interfaces if i.name == "eth0")
    assert "192.168.0.2/24" in eth0.addresses and "192.168.1.2/32" in eth0.addresses


def test_every_mode_agrees_on_the_bundled_example_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    """The README's verify command on examples/cluster.yaml (loopback endpoints) exits 0."""
    status = main(["verify", "--manifests", "examples/cluster.yaml", "--hostname-override", "node-a",
                   "--node-ip", "192.168.0.2", "--cluster-cidr", "10.244.0.0/16", "--examples", "150"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "ipvs-loopback-real-servers-from-outside" in out


def test_a_node_dump_directory_is_compared_as_its_iptables_save_with_this_nodes_pod_cidr(
        manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--node-dump DIR`` compares DIR/iptables-save.txt; ``--pod-cidr`` gives the node's pod range."""
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "iptables-save.txt").write_text(_with_docker(_node_dump()))
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--node-dump", str(tmp_path / "dump"), "--pod-cidr", "10.0.5.0/24", "--examples", "100"]) == 0
    assert "iptables, node-dump agree" in capsys.readouterr().out
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--node-dump", str(tmp_path / "dump"), "--pod-cidr", "172.16.0.0/24"]) == 2
    err = capsys.readouterr().err
    assert "--pod-cidr" in err and "outside the cluster CIDR" in err
    assert main(["verify", "--manifests", str(manifests), *FLAGS, "--node-dump", str(tmp_path)]) == 2
    assert "no iptables-save.txt" in capsys.readouterr().err
