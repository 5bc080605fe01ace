"""Small builders for the IPVS tests: services from weights, packets, address integers."""

from __future__ import annotations

from emulation.ipvs import DestSpec, SchedInput, Service, ServiceKey, ServiceSpec, parse_address
from emulation.packet import Packet

VIP = "10.96.0.1"


def ip(text: str) -> int:
    """An IPv4/IPv6 address as an integer."""
    return parse_address(text)[1]


def key(port: int = 80, proto: str = "tcp", vip: str = VIP) -> ServiceKey:
    """A TCP service key on the VIP."""
    v, a = parse_address(vip)
    return ServiceKey(v, proto, a, port)  # type: ignore[arg-type]


def service(scheduler: str, adds: list[tuple[str, int]], *, flags: int = 0, port: int = 80) -> Service:
    """A service whose real servers ``(address, weight)`` are added in the given order (each to the head)."""
    svc = Service(ServiceSpec(key=key(port), scheduler=scheduler, flags=flags))
    for addr, weight in adds:
        svc.add_dest(DestSpec(addr=parse_address(addr), port=8080, weight=weight))
    return svc


def pick(svc: Service, src: str = "10.0.0.5", sport: int = 40000) -> str | None:
    """The address the service's scheduler chooses for a packet from ``src``."""
    v, s = parse_address(src)
    d = svc.schedule(SchedInput(v, s, sport, svc.spec.key.addr, svc.spec.key.port, "tcp"))
    return None if d is None else d.label.rsplit(":", 1)[0]


def picks(svc: Service, n: int) -> list[str | None]:
    """``n`` consecutive choices."""
    return [pick(svc) for _ in range(n)]


def dest(svc: Service, addr: str):  # type: ignore[no-untyped-def]
    """The live real server with this address."""
    return svc.find((*parse_address(addr), 8080))


def syn(
    src: str = "10.0.0.5", sport: int = 40000, dst: str = VIP, dport: int = 80, proto: str = "tcp"
) -> Packet:
    """A first packet from a client to the VIP."""
    return Packet(src=src, dst=dst, sport=sport, dport=dport, protocol=proto)  # type: ignore[arg-type]
