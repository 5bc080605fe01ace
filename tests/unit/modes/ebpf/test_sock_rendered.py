"""The socket-LB programs over maps the renderer wrote (Cilium's agent layout), on the machine."""

from __future__ import annotations

import errno
from fractions import Fraction

from emulation.bpf import AttachType, SockAddr
from kproxy.kernel.bpf import EmulatedBpf
from kproxy.modes.ebpf import MapState, render_maps
from kproxy.modes.ebpf.datapath import (
    ConnectVerdict,
    SockLB,
    emulated_socklb,
    predict_connect,
    sock_program,
)
from tests.bpf_rendered import NODE, web_snapshot

CONNECT4 = AttachType.CGROUP_INET4_CONNECT
ENDPOINTS = ("10.244.1.5", "10.244.1.6", "10.244.2.7")


def _node(maps: dict[str, dict[bytes, bytes]]) -> tuple[EmulatedBpf, SockLB]:
    k = EmulatedBpf()
    lb = SockLB.load(k, max_entries=256)
    lb.fill(maps)
    lb.attach("/cg")
    return k, lb


def _destinations(k: EmulatedBpf, lb: SockLB) -> set[str]:
    fds = {name: fd for (fam, name), fd in lb.maps.items() if fam.value == "IPv4"}
    outs = k.machine().enumerate(sock_program(CONNECT4).assemble(fds),
                                 SockAddr(attach=CONNECT4, user_ip="10.96.0.10", user_port=80))
    return {f"{o.ctx.user_ip}:{o.ctx.user_port}" for o in outs if isinstance(o.ctx, SockAddr)}


def test_a_rendered_cluster_ip_spreads_over_its_endpoints() -> None:
    """Every endpoint the renderer placed in a slot is a possible destination, nothing else."""
    k, lb = _node(render_maps(web_snapshot(ENDPOINTS), NODE).entries())
    assert _destinations(k, lb) == {f"{a}:8080" for a in ENDPOINTS}


def test_a_rendered_service_without_endpoints_refuses_with_ehostunreach() -> None:
    """The renderer's count-0 master entry makes connect4 refuse with EHOSTUNREACH."""
    k, _ = _node(render_maps(web_snapshot(ENDPOINTS), NODE).entries())
    res = k.run_sock_addr("/cg", SockAddr(attach=CONNECT4, user_ip="10.96.0.12", user_port=80))
    assert res is not None and (res.ret32, res.retval) == (0, -errno.EHOSTUNREACH)


def test_a_partial_sync_removing_an_endpoint_takes_effect_at_once() -> None:
    """The ops of one sync applied to the maps leave the removed endpoint out of every outcome."""
    state = MapState(config=NODE)
    k = EmulatedBpf()
    lb = SockLB.load(k, max_entries=256)
    lb.attach("/cg")
    lb.apply(state.sync(web_snapshot(ENDPOINTS, revision=1)))
    assert _destinations(k, lb) == {f"{a}:8080" for a in ENDPOINTS}
    ops = state.sync(web_snapshot(ENDPOINTS[:2], revision=2))
    lb.apply(ops)
    assert _destinations(k, lb) == {f"{a}:8080" for a in ENDPOINTS[:2]}


def test_predict_connect_gives_the_distribution_of_a_rendered_service() -> None:
    """predict_connect: three endpoints at ~1/3 each; no backends refused; elsewhere untranslated."""
    k, lb = emulated_socklb(render_maps(web_snapshot(ENDPOINTS), NODE).entries(), max_entries=256)
    web = predict_connect(k, lb, "10.96.0.10", 80)
    assert {(o.verdict, o.address, o.port) for o in web} == {
        (ConnectVerdict.TRANSLATED, a, 8080) for a in ENDPOINTS}
    assert sum(o.probability for o in web) == 1
    assert all(abs(o.probability - Fraction(1, 3)) < 1e-6 for o in web)
    assert [(o.verdict, o.errno) for o in predict_connect(k, lb, "10.96.0.12", 80)] == [
        (ConnectVerdict.REFUSED, errno.EHOSTUNREACH)]
    assert [(o.verdict, o.address) for o in predict_connect(k, lb, "10.96.0.99", 80)] == [
        (ConnectVerdict.UNTRANSLATED, "10.96.0.99")]
