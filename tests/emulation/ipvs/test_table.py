"""The connection table: TCP/UDP states and counters, timeouts, persistence, weight 0 vs deletion."""

from __future__ import annotations

from emulation.ipvs import IpvsTable, Sysctls, load_rules
from emulation.packet import Packet
from tests.emulation.ipvs.helpers import VIP, syn

RULES = """-A -t 10.96.0.1:80 -s rr
-a -t 10.96.0.1:80 -r 10.244.1.2:8080 -m -w 1
-a -t 10.96.0.1:80 -r 10.244.2.3:8080 -m -w 1
-A -u 10.96.0.1:53 -s rr
-a -u 10.96.0.1:53 -r 10.244.1.2:53 -m -w 1
"""
A, B = "10.244.1.2", "10.244.2.3"


def table(sysctls: Sysctls | None = None, rules: str = RULES) -> IpvsTable:
    return load_rules(rules, sysctls=sysctls)


def counts(t: IpvsTable, addr: str, port: int = 80) -> tuple[int, int]:
    """(ActiveConn, InActConn) of a real server of the TCP service."""
    svc = next(s for s in t.services() if s.spec.key.port == port)
    d = next(d for d in svc.dests if d.label.startswith(addr))
    return d.activeconns, d.inactconns


def reply(src: str, sport: int = 8080, dst: str = "10.0.0.5", dport: int = 40000) -> Packet:
    return Packet(src=src, dst=dst, sport=sport, dport=dport, syn=False)


def test_syn_creates_an_active_syn_recv_connection() -> None:
    """ip_vs_conn_new binds INACTIVE, then the INPUT syn row moves NONE -> SYN_RECV (active)."""
    t = table()
    r = t.process(syn(), 0.0)
    assert (r.verdict, r.real, r.state, r.new_connection) == ("forward", (B, 8080), "SYN_RECV", True)
    assert counts(t, B) == (1, 0)


def test_client_rst_in_syn_recv_keeps_syn_recv() -> None:
    """The INPUT rst row maps sSR to sSR (ip_vs_proto_tcp.c): a client RST right after SYN changes nothing."""
    t = table()
    t.process(syn(), 0.0)
    assert t.process(syn(), 0.1, flags="R").state == "SYN_RECV"


def test_tcp_lifecycle_moves_between_active_and_inactive() -> None:
    """SYN -> SYN_RECV, ACK -> ESTABLISHED (900 s), client FIN -> CLOSE_WAIT (inactive), server FIN -> TW."""
    t = table()
    t.process(syn(), 0.0)
    assert t.process(syn(), 0.1, flags="A").state == "ESTABLISHED"
    assert t.connections()[0].expires_in_s == 900
    assert t.process(syn(), 1.0, flags="FA").state == "CLOSE_WAIT"
    assert counts(t, B) == (0, 1)
    assert t.process_reply(reply(B), 1.1, flags="FA").state == "TIME_WAIT"
    assert t.connections()[0].expires_in_s == 120


def test_connection_expires_after_its_state_timeout() -> None:
    """The timer fires cp->timeout after the last packet: SYN_RECV lasts 60 s, then counters drop."""
    t = table()
    t.process(syn(), 0.0)
    t.advance(59.9)
    assert counts(t, B) == (1, 0)
    t.advance(60.0)
    assert counts(t, B) == (0, 0)
    assert t.connections() == ()


def test_reply_is_translated_back_to_the_virtual_address() -> None:
    """ip_vs_out finds the connection by the real server's tuple and rewrites the source to vaddr:vport."""
    t = table()
    t.process(syn(), 0.0)
    r = t.process_reply(reply(B), 0.1, flags="SA")
    assert r.translated == (VIP, 80)


def test_non_syn_without_connection_goes_to_the_local_stack() -> None:
    """tcp_conn_schedule only schedules a SYN (no RST): a stray ACK is NF_ACCEPTed."""
    t = table()
    assert t.process(syn(), 0.0, flags="A").verdict == "accept"


def test_udp_counts_inactive_with_300_s_timeout() -> None:
    """ip_vs_proto_udp has one state: the connection stays in InActConn and lives 300 s."""
    t = table()
    r = t.process(syn(dport=53, proto="udp"), 0.0)
    assert r.state == "UDP"
    assert counts(t, A, 53) == (0, 1)
    assert t.connections()[0].expires_in_s == 300


def test_no_real_server_rejects_with_port_unreachable() -> None:
    """ip_vs_schedule returns NULL and ip_vs_leave sends ICMP port unreachable."""
    t = table(rules="-A -t 10.96.0.1:80 -s rr\n")
    assert t.process(syn(), 0.0).verdict == "reject"


def test_packets_to_unknown_services_are_not_touched() -> None:
    """No virtual service: IPVS returns NF_ACCEPT and the local stack gets the packet."""
    assert table().process(syn(dport=81), 0.0).verdict == "accept"


def test_weight_zero_keeps_existing_connections() -> None:
    """A quiesced server stays AVAILABLE: its connections continue, new ones go elsewhere."""
    t = table()
    t.process(syn(), 0.0)
    t.process(syn(), 0.1, flags="A")
    load_rules("-e -t 10.96.0.1:80 -r 10.244.2.3:8080 -m -w 0", t)
    assert t.process(syn(), 1.0, flags="A").real == (B, 8080)
    assert t.process(syn(sport=40001), 1.0).real == (A, 8080)


def test_deleted_server_drops_packets_by_default() -> None:
    """expire_nodest_conn=0: packets of a connection to a deleted server are dropped silently."""
    t = table()
    t.process(syn(), 0.0)
    load_rules("-d -t 10.96.0.1:80 -r 10.244.2.3:8080", t, now=1.0)
    assert t.process(syn(), 2.0, flags="A").verdict == "drop"
    assert len(t.connections()) == 1


def test_deleted_server_with_expire_nodest_conn_flushes_connections() -> None:
    """expire_nodest_conn=1 on 5.9+: ip_vs_expire_nodest_conn_flush deletes the connections at once."""
    t = table(Sysctls(expire_nodest_conn=True))
    t.process(syn(), 0.0)
    load_rules("-d -t 10.96.0.1:80 -r 10.244.2.3:8080", t, now=1.0)
    assert t.connections() == ()


def test_deleted_server_without_flush_expires_on_next_packet() -> None:
    """Before 5.9 the connection is expired when its next packet arrives; a SYN is then rescheduled."""
    t = table(Sysctls(expire_nodest_conn=True, nodest_flush=False))
    t.process(syn(), 0.0)
    load_rules("-d -t 10.96.0.1:80 -r 10.244.2.3:8080", t, now=1.0)
    r = t.process(syn(), 2.0)
    assert (r.verdict, r.real) == ("forward", (A, 8080))


def test_deleted_server_is_revived_from_the_trash() -> None:
    """ip_vs_add_dest finds the same server in the trash and reuses it, counters and connections included."""
    t = table()
    t.process(syn(), 0.0)
    load_rules("-d -t 10.96.0.1:80 -r 10.244.2.3:8080\n-a -t 10.96.0.1:80 -r 10.244.2.3:8080 -m -w 1", t)
    assert counts(t, B) == (1, 0)
    assert t.process(syn(), 1.0, flags="A").state == "ESTABLISHED"


def test_syn_to_weight_zero_server_is_rescheduled_with_expire_nodest_conn() -> None:
    """ip_vs_in: a reused-port SYN whose connection's server has weight 0 is rescheduled."""
    t = table(Sysctls(expire_nodest_conn=True))
    t.process(syn(), 0.0)
    load_rules("-e -t 10.96.0.1:80 -r 10.244.2.3:8080 -m -w 0", t)
    assert t.process(syn(), 1.0).real == (A, 8080)


def test_syn_on_established_connection_reuses_it_by_default() -> None:
    """Without expire_nodest_conn, is_new_conn_expected is false for ESTABLISHED: the old entry is reused."""
    t = table()
    t.process(syn(), 0.0)
    t.process(syn(), 0.1, flags="A")
    load_rules("-e -t 10.96.0.1:80 -r 10.244.2.3:8080 -m -w 0", t)
    assert t.process(syn(), 1.0).real == (B, 8080)


def test_conn_reuse_mode_reschedules_time_wait() -> None:
    """conn_reuse_mode=1: a SYN reusing a TIME_WAIT connection's ports expires it and is scheduled anew."""
    t = table()
    t.process(syn(), 0.0)
    t.process(syn(), 0.1, flags="A")
    t.process(syn(), 0.2, flags="FA")
    t.process_reply(reply(B), 0.3, flags="FA")
    r = t.process(syn(), 1.0)
    assert (r.new_connection, r.real) == (True, (A, 8080))


def test_conn_reuse_mode_zero_reuses_time_wait() -> None:
    """conn_reuse_mode=0 disables the block: the SYN revives the TIME_WAIT entry to the same server."""
    t = table(Sysctls(conn_reuse_mode=0))
    t.process(syn(), 0.0)
    t.process(syn(), 0.1, flags="A")
    t.process(syn(), 0.2, flags="FA")
    t.process_reply(reply(B), 0.3, flags="FA")
    r = t.process(syn(), 1.0)
    assert (r.new_connection, r.real, r.state) == (False, (B, 8080), "SYN_RECV")


def test_pre_5_9_reuse_with_conntrack_drops_the_syn() -> None:
    """Before 5.9 a reused-port SYN on an NFCT connection counts as old conntrack: NF_DROP (1 s retry)."""
    t = table(Sysctls(conntrack=True, pre_5_9_reuse=True))
    t.process(syn(), 0.0)
    t.process(syn(), 0.1, flags="A")
    t.process(syn(), 0.2, flags="R")
    assert t.process(syn(), 1.0).verdict == "drop"
    assert t.process(syn(), 2.0).new_connection


PERSIST = """-A -t 10.96.0.1:80 -s rr -p 100
-a -t 10.96.0.1:80 -r 10.244.1.2:8080 -m -w 1
-a -t 10.96.0.1:80 -r 10.244.2.3:8080 -m -w 1
"""


def test_persistence_pins_a_client_to_one_server() -> None:
    """ip_vs_sched_persist: the template <tcp, 10.0.0.5, 0, vip, 80> sends every new connection to B."""
    t = table(rules=PERSIST)
    assert {t.process(syn(sport=p), 0.0).real for p in range(40000, 40005)} == {(B, 8080)}
    assert t.process(syn(src="10.0.0.6"), 0.0).real == (A, 8080)


def test_persistence_template_counts_in_persistconns() -> None:
    """ip_vs_bind_dest counts a template in persistconns, not in ActiveConn/InActConn."""
    t = table(rules=PERSIST)
    t.process(syn(), 0.0)
    d = t.services()[0].dests[0]
    assert (d.activeconns, d.inactconns, d.persistconns) == (1, 0, 1)


def test_persistence_times_out_after_the_last_connection() -> None:
    """At 100 s the template still controls an ESTABLISHED connection and is re-armed for 60 s (expire_later).

    The connection is reset at 100 s (CLOSE, 10 s), so the template dies at 160 s; rr then moves on.
    """
    t = table(rules=PERSIST)
    t.process(syn(), 0.0)
    t.process(syn(), 0.1, flags="A")
    t.advance(100.0)
    assert [c.expires_in_s for c in t.connections() if c.template] == [60.0]
    t.process(syn(), 100.0, flags="R")
    t.advance(159.9)
    assert any(c.template for c in t.connections())
    t.advance(160.0)
    assert t.connections() == ()
    assert t.process(syn(sport=41000), 161.0).real == (A, 8080)


def test_persistence_timer_restarts_with_each_new_connection() -> None:
    """ip_vs_conn_put(ct) in ip_vs_sched_persist re-arms the template with the full timeout."""
    t = table(rules=PERSIST)
    t.process(syn(sport=1), 0.0)
    t.process(syn(sport=2), 50.0)
    tmpl = next(c for c in t.connections() if c.template)
    assert tmpl.expires_in_s == 100


def test_persistence_to_quiesced_server_by_default() -> None:
    """expire_quiescent_template=0: new connections still follow a template to a weight-0 server."""
    t = table(rules=PERSIST)
    t.process(syn(), 0.0)
    load_rules("-e -t 10.96.0.1:80 -r 10.244.2.3:8080 -m -w 0", t)
    assert t.process(syn(sport=40001), 1.0).real == (B, 8080)


def test_expire_quiescent_template_reschedules() -> None:
    """expire_quiescent_template=1 invalidates the template (ip_vs_check_template) and schedules again."""
    t = table(Sysctls(expire_quiescent_template=True), rules=PERSIST)
    t.process(syn(), 0.0)
    load_rules("-e -t 10.96.0.1:80 -r 10.244.2.3:8080 -m -w 0", t)
    assert t.process(syn(sport=40001), 1.0).real == (A, 8080)


def test_persistence_netmask_groups_clients() -> None:
    """-M 255.255.255.0 masks the client into the template key: 10.0.0.5 and 10.0.0.6 share a server."""
    t = table(rules=PERSIST.replace("-p 100", "-p 100 -M 255.255.255.0"))
    assert t.process(syn(src="10.0.0.5"), 0.0).real == t.process(syn(src="10.0.0.6"), 0.0).real


def test_time_cannot_go_backwards() -> None:
    """Injected time is monotonic; an earlier time is refused."""
    t = table()
    t.advance(5.0)
    try:
        t.advance(4.0)
    except ValueError as e:
        assert "backwards" in str(e)
    else:
        raise AssertionError("expected IpvsError")


def test_ipv6_service_schedules() -> None:
    """IPv6 services and real servers work like IPv4 ones."""
    t = load_rules("-A -t [fd00::1]:80 -s rr\n-a -t [fd00::1]:80 -r [fd00::10]:8080 -m -w 1\n")
    r = t.process(Packet(src="fd00::5", dst="fd00::1", sport=1000, dport=80), 0.0)
    assert r.real == ("fd00::10", 8080)
