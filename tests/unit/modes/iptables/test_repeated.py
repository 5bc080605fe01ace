"""TestSyncProxyRulesRepeated: kube-proxy's expected full and partial restores, step by step."""

# The expected rules are kube-proxy's, one rule per line, verbatim.
# ruff: noqa: E501

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from kproxy.model import Snapshot
from kproxy.modes.iptables import (
    IptablesConfig,
    IptablesRenderer,
    render_full,
    render_partial,
    sort_restore_text,
)
from tests.unit.modes.kube import endpoint_slice, ep, next_snapshot, port, service, snapshot_of

# The test's proxier predates the nfacct counters; otherwise it is NewFakeProxier.
CONFIG = IptablesConfig(node_ips=("192.168.0.2",), cluster_cidr=("10.0.0.0/8",), masquerade_mark="0x4000",
                        random_fully=False, nfacct=False)

FILTER = textwrap.dedent("""\
    *filter
    :KUBE-NODEPORTS - [0:0]
    :KUBE-SERVICES - [0:0]
    :KUBE-EXTERNAL-SERVICES - [0:0]
    :KUBE-FIREWALL - [0:0]
    :KUBE-FORWARD - [0:0]
    :KUBE-PROXY-FIREWALL - [0:0]
    {services}-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
    -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
    -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
    -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
    COMMIT
    """)
POSTROUTING = textwrap.dedent("""\
    -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
    -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
    -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
    -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
    """)
TAIL = ('-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last'
        ' rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n')
CHAINS = {"svc1": "XPGD46QRK7WJZT7O", "svc2": "2VJB64SDSIJUP5T6", "svc3": "X27LE4BHSL4DOUIK",
          "svc4": "4SW47YFZTEDKD3PK"}
IPS = {"svc1": "172.30.0.41", "svc2": "172.30.0.42", "svc3": "172.30.0.43", "svc4": "172.30.0.44"}


def cluster_ip_rule(svc: str, port_name: str = "p80", number: int = 80) -> str:
    n = svc[-1]
    return (f'-A KUBE-SERVICES -m comment --comment "ns{n}/{svc}:{port_name} cluster IP" -m tcp -p tcp'
            f" -d {IPS[svc]} --dport {number} -j KUBE-SVC-{CHAINS[svc]}\n")


def service_chains(svc: str, eps: list[tuple[str, str]], port_name: str = "p80", number: int = 80) -> list[str]:
    """The SVC and SEP rules of a ClusterIP port whose endpoints are (ip, SEP hash)."""
    spn = f"ns{svc[-1]}/{svc}:{port_name}"
    svc_chain = f"KUBE-SVC-{CHAINS[svc]}"
    lines = []
    for ip, h in eps:
        lines.append(f"-A KUBE-SEP-{h} -m comment --comment {spn} -s {ip} -j KUBE-MARK-MASQ\n")
        lines.append(f"-A KUBE-SEP-{h} -m comment --comment {spn} -m tcp -p tcp -j DNAT --to-destination {ip}:{number}\n")
    lines.append(f'-A {svc_chain} -m comment --comment "{spn} cluster IP" -m tcp -p tcp -d {IPS[svc]}'
                 f" --dport {number} ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ\n")
    for i, (ip, h) in enumerate(eps):
        prob = f" -m statistic --mode random --probability {1 / (len(eps) - i):.10f}" if i < len(eps) - 1 else ""
        lines.append(f'-A {svc_chain} -m comment --comment "{spn} -> {ip}:{number}"{prob} -j KUBE-SEP-{h}\n')
    return lines


def expected(*, services: list[str], chains: list[str], rules: list[str], deleted: list[str] = (),  # type: ignore[assignment]
             filter_services: str = "") -> str:
    decls = "".join(f":{c} - [0:0]\n" for c in sorted(["KUBE-MARK-MASQ", "KUBE-POSTROUTING", *chains]))
    services_rules = "".join(services) + TAIL
    body = sorted(rules + POSTROUTING.splitlines(keepends=True), key=_chain_of)
    nat = ("*nat\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SERVICES - [0:0]\n" + decls + services_rules
           + "".join(body) + "".join(f"-X {c}\n" for c in sorted(deleted)) + "COMMIT\n")
    return FILTER.format(services=filter_services) + nat


def _chain_of(rule: str) -> str:
    return rule.split(" ", 2)[1]


def docs(svcs: dict[str, list[str]], *, svc2: bool = True, svc4: bool = False) -> list[dict[str, Any]]:
    """Services svc1..svc4 (svc2 optional) and the endpoint IPs of those in ``svcs``."""
    out: list[dict[str, Any]] = [service("ns1", "svc1", "172.30.0.41", [port("p80", 80)])]
    if svc2:
        out.append(service("ns2", "svc2", "172.30.0.42", [port("p8080", 8080)]))
    if "svc3" in svcs:
        out.append(service("ns3", "svc3", "172.30.0.43", [port("p80", 80)]))
    if svc4:
        out.append(service("ns4", "svc4", "172.30.0.44", [port("p80", 80)]))
    for name, ips in svcs.items():
        n = name[-1]
        pname, number = ("p8080", 8080) if name == "svc2" else ("p80", 80)
        out.append(endpoint_slice(f"ns{n}", name, [ep(ip) for ip in ips], [(pname, number, "TCP")]))
    return out


SVC1 = service_chains("svc1", [("10.0.1.1", "SNQ3ZNILQDEJNDQO")])
SVC2 = service_chains("svc2", [("10.0.2.1", "UHEGFW77JX3KXTOV")], "p8080", 8080)
SVC1_2 = [cluster_ip_rule("svc1"), cluster_ip_rule("svc2", "p8080", 8080)]

STEPS: list[tuple[str, dict[str, Any], str]] = [
    ("add svc3 and its endpoints", {"svcs": {"svc1": ["10.0.1.1"], "svc2": ["10.0.2.1"], "svc3": ["10.0.3.1"]}},
     expected(services=[*SVC1_2, cluster_ip_rule("svc3")],
              chains=["KUBE-SEP-BSWRHOQ77KEXZLNL", "KUBE-SVC-X27LE4BHSL4DOUIK"],
              rules=service_chains("svc3", [("10.0.3.1", "BSWRHOQ77KEXZLNL")]))),
    ("delete svc2", {"svcs": {"svc1": ["10.0.1.1"], "svc3": ["10.0.3.1"]}, "svc2": False},
     expected(services=[cluster_ip_rule("svc1"), cluster_ip_rule("svc3")],
              chains=["KUBE-SEP-UHEGFW77JX3KXTOV", "KUBE-SVC-2VJB64SDSIJUP5T6"], rules=[],
              deleted=["KUBE-SEP-UHEGFW77JX3KXTOV", "KUBE-SVC-2VJB64SDSIJUP5T6"])),
    ("add svc4 without endpoints", {"svcs": {"svc1": ["10.0.1.1"], "svc3": ["10.0.3.1"]}, "svc2": False,
                                    "svc4": True},
     expected(services=[cluster_ip_rule("svc1"), cluster_ip_rule("svc3")], chains=[], rules=[],
              filter_services='-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 has no endpoints" -m tcp -p tcp'
                              " -d 172.30.0.44 --dport 80 -j REJECT\n")),
    ("add svc4's endpoints", {"svcs": {"svc1": ["10.0.1.1"], "svc3": ["10.0.3.1"], "svc4": ["10.0.4.1"]},
                              "svc2": False, "svc4": True},
     expected(services=[cluster_ip_rule("svc1"), cluster_ip_rule("svc3"), cluster_ip_rule("svc4")],
              chains=["KUBE-SEP-AYCN5HPXMIRJNJXU", "KUBE-SVC-4SW47YFZTEDKD3PK"],
              rules=service_chains("svc4", [("10.0.4.1", "AYCN5HPXMIRJNJXU")]))),
    ("change svc3's endpoint", {"svcs": {"svc1": ["10.0.1.1"], "svc3": ["10.0.3.2"], "svc4": ["10.0.4.1"]},
                                "svc2": False, "svc4": True},
     expected(services=[cluster_ip_rule("svc1"), cluster_ip_rule("svc3"), cluster_ip_rule("svc4")],
              chains=["KUBE-SEP-BSWRHOQ77KEXZLNL", "KUBE-SEP-DKCFIS26GWF2WLWC", "KUBE-SVC-X27LE4BHSL4DOUIK"],
              rules=service_chains("svc3", [("10.0.3.2", "DKCFIS26GWF2WLWC")]),
              deleted=["KUBE-SEP-BSWRHOQ77KEXZLNL"])),
    ("add an endpoint to svc3", {"svcs": {"svc1": ["10.0.1.1"], "svc3": ["10.0.3.2", "10.0.3.3"],
                                          "svc4": ["10.0.4.1"]}, "svc2": False, "svc4": True},
     expected(services=[cluster_ip_rule("svc1"), cluster_ip_rule("svc3"), cluster_ip_rule("svc4")],
              chains=["KUBE-SEP-DKCFIS26GWF2WLWC", "KUBE-SEP-JVVZVJ7BSEPPRNBS", "KUBE-SVC-X27LE4BHSL4DOUIK"],
              rules=service_chains("svc3", [("10.0.3.2", "DKCFIS26GWF2WLWC"), ("10.0.3.3", "JVVZVJ7BSEPPRNBS")]))),
    ("no-op sync", {"svcs": {"svc1": ["10.0.1.1"], "svc3": ["10.0.3.2", "10.0.3.3"], "svc4": ["10.0.4.1"]},
                    "svc2": False, "svc4": True},
     expected(services=[cluster_ip_rule("svc1"), cluster_ip_rule("svc3"), cluster_ip_rule("svc4")],
              chains=[], rules=[])),
]


def initial() -> Snapshot:
    return snapshot_of(docs({"svc1": ["10.0.1.1"], "svc2": ["10.0.2.1"]}))


def test_initial_full_sync() -> None:
    """The first sync writes both Services' chains."""
    want = expected(services=SVC1_2, rules=SVC1 + SVC2, chains=[
        "KUBE-SEP-SNQ3ZNILQDEJNDQO", "KUBE-SEP-UHEGFW77JX3KXTOV", "KUBE-SVC-2VJB64SDSIJUP5T6",
        "KUBE-SVC-XPGD46QRK7WJZT7O"])
    assert sort_restore_text(render_full(initial(), CONFIG)) == want


def test_partial_syncs_match_kube_proxy() -> None:
    """Each later sync writes the top-level chains and only the changed Services' chains."""
    previous = initial()
    renderer = IptablesRenderer(CONFIG)
    renderer.commit(renderer.render(previous))
    for name, kwargs, want in STEPS:
        snapshot = next_snapshot(previous, docs(**kwargs))
        assert sort_restore_text(render_partial(previous, snapshot, CONFIG)) == want, name
        result = renderer.render(snapshot)
        assert not result.full
        assert sort_restore_text(result.text) == want, name
        renderer.commit(result)
        previous = snapshot


def test_full_sync_after_failure_deletes_stale_chains() -> None:
    """After a failed restore the next sync is full, and still deletes the chains it knows are stale."""
    renderer = IptablesRenderer(CONFIG)
    first = initial()
    renderer.commit(renderer.render(first))
    second = next_snapshot(first, docs({"svc1": ["10.0.1.1"]}, svc2=False))
    renderer.render(second)
    renderer.failed()
    assert renderer.needs_full
    result = renderer.render(second)
    assert result.full
    assert result.deleted_chains == ("KUBE-SEP-UHEGFW77JX3KXTOV", "KUBE-SVC-2VJB64SDSIJUP5T6")
    assert "KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]" in result.text


def test_commit_needs_the_latest_render() -> None:
    """commit() refuses a result that is not the latest render."""
    renderer = IptablesRenderer(CONFIG)
    stale = renderer.render(initial())
    renderer.render(initial())
    with pytest.raises(TypeError, match="latest render"):
        renderer.commit(stale)


def test_partial_render_needs_a_commit() -> None:
    """A partial render without any committed state is refused."""
    with pytest.raises(TypeError, match="committed render"):
        IptablesRenderer(CONFIG).render(initial(), full=False)


def test_full_render_deletes_existing_stale_chains() -> None:
    """render_full deletes stale per-service chains found in the kernel, never foreign ones."""
    text = render_full(initial(), CONFIG, existing_chains={"KUBE-SVC-AAAAAAAAAAAAAAAA", "CNI-FOO",
                                                           "KUBE-SVC-XPGD46QRK7WJZT7O"})
    assert "-X KUBE-SVC-AAAAAAAAAAAAAAAA\n" in text
    assert "CNI-FOO" not in text
    assert "-X KUBE-SVC-XPGD46QRK7WJZT7O" not in text
