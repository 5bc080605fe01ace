"""A tc DNAT program through BPF_PROG_TEST_RUN agrees with the BPF machine: same return code,
same output packet, same map state; and the machine's translation is the expected one."""

from __future__ import annotations

import pytest

from emulation.bpf import R0, R1, R2, R6, R7, Asm, ProgType
from kproxy.kernel.bpf import BpfKernel, EmulatedBpf, ProgramSpec, TestRun
from kproxy.kernel.linux_bpf import LinuxBpf
from tests.conftest import require_kernel
from tests.kernel.bpf_programs import (
    HITS,
    SERVICES,
    TC_ACT_OK,
    TC_ACT_SHOT,
    backend_value,
    checksums_valid,
    frame,
    service_key,
    tc_dnat,
)

PACKETS = {
    "tcp-to-service": frame("10.0.0.1", "10.96.0.10", 40000, 80, 6),
    "udp-to-service": frame("10.0.0.1", "10.96.0.10", 40001, 53, 17, b"q" * 31),
    "udp-no-checksum": frame("10.0.0.2", "10.96.0.10", 40002, 53, 17, udp_csum=False),
    "tcp-other-port": frame("10.0.0.1", "10.96.0.10", 40000, 81, 6),
    "tcp-other-ip": frame("10.0.0.1", "10.96.0.11", 40000, 80, 6),
    "short": bytes(20),
    "arp-like": bytes(12) + b"\x08\x06" + bytes(40),
}


def _load(k: BpfKernel) -> tuple[int, int, int]:
    svc, hits = k.create_map(SERVICES), k.create_map(HITS)
    k.update(svc, service_key("10.96.0.10", 80, 6), backend_value("10.244.1.5", 8080))
    k.update(svc, service_key("10.96.0.10", 53, 17), backend_value("10.244.2.7", 5353))
    prog = k.load_program(ProgramSpec(type=ProgType.SCHED_CLS, name="tc_dnat",
                                      code=tc_dnat().assemble({"svc": svc, "hits": hits})))
    return svc, hits, prog


def _run_all(k: BpfKernel) -> tuple[dict[str, TestRun], bytes | None, list[bytes]]:
    svc, hits, prog = _load(k)
    try:
        runs = {name: k.test_run(prog, pkt) for name, pkt in PACKETS.items()}
        return runs, k.lookup(hits, bytes(4)), sorted(k.keys(svc))
    finally:
        for fd in (prog, hits, svc):
            k.close(fd)


def test_machine_translates_service_packets_with_valid_checksums() -> None:
    """On the machine, Service packets leave DNATed to their backend with valid checksums."""
    runs, hits, _ = _run_all(EmulatedBpf())
    tcp, udp = runs["tcp-to-service"], runs["udp-to-service"]
    assert tcp.retval == TC_ACT_OK and tcp.data[30:34] == bytes([10, 244, 1, 5])
    assert tcp.data[36:38] == (8080).to_bytes(2, "big") and checksums_valid(tcp.data)
    assert udp.data[30:34] == bytes([10, 244, 2, 7]) and checksums_valid(udp.data)
    assert runs["udp-no-checksum"].data[40:42] == b"\x00\x00"  # MARK_MANGLED_0 keeps "no checksum"
    assert runs["tcp-other-port"].data == PACKETS["tcp-other-port"]
    assert runs["short"].retval == TC_ACT_SHOT
    assert hits == (3).to_bytes(8, "little")


@pytest.mark.kernel
def test_kernel_test_run_agrees_with_the_machine_on_every_packet() -> None:
    """BPF_PROG_TEST_RUN and the machine give the same code, packet and map state per packet."""
    require_kernel()
    linux, hits_l, keys_l = _run_all(LinuxBpf())
    emulated, hits_e, keys_e = _run_all(EmulatedBpf())
    for name in PACKETS:
        assert (linux[name].retval, linux[name].data.hex()) == \
            (emulated[name].retval, emulated[name].data.hex()), name
    assert hits_l == hits_e and keys_l == keys_e


def _legacy_loads() -> bytes:
    """r0 = the IPv4 protocol byte (LD ABS) xor the destination port (LD IND); 0 past the end."""
    a = Asm().mov(R6, R1).ld_abs(1, 23).mov(R7, R0).mov(R2, 2).ld_ind(2, R2, 34).xor(R0, R7).exit()
    return a.assemble()


@pytest.mark.kernel
def test_legacy_packet_loads_agree_with_the_kernel() -> None:
    """LD ABS and LD IND give the kernel's values, and its 0 past the packet's end."""
    require_kernel()
    codes = {}
    for k in (LinuxBpf(), EmulatedBpf()):
        prog = k.load_program(ProgramSpec(type=ProgType.SCHED_CLS, name="ldabs", code=_legacy_loads()))
        try:
            codes[type(k).__name__] = [k.test_run(prog, pkt).retval for pkt in PACKETS.values()]
        finally:
            k.close(prog)
    assert codes["LinuxBpf"] == codes["EmulatedBpf"]
    assert codes["EmulatedBpf"][0] == 6 ^ 80
