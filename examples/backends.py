"""The example cluster's pods: one small identity server per endpoint in a manifest.

Each endpoint ``ip:port`` of every EndpointSlice gets a server on that loopback address that
answers every request (a TCP line or a UDP datagram) with ``<ip:port> <request>``, so a client
can see which pod answered. Run it as::

    python examples/backends.py examples/cluster.yaml

It prints ``ready <n>`` once every server listens, and runs until interrupted.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterable

import yaml

from kproxy.model import EndpointSlice, Protocol, join_host_port
from kproxy.model.objects import parse_objects
from kproxy.testing.harness import TcpIdentity, UdpIdentity


def endpoints_of(slices: Iterable[EndpointSlice]) -> set[tuple[str, int, Protocol]]:
    """Every ``(ip, port, protocol)`` the slices name, as the pods would listen."""
    out = set()
    for eps in slices:
        for port in eps.ports:
            for ep in eps.endpoints:
                out.add((ep.address, port.port, port.protocol))
    return out


async def serve(paths: list[str], stop: asyncio.Event) -> None:
    """Start one identity server per endpoint found in ``paths`` and run until ``stop``."""
    slices: list[EndpointSlice] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for doc in yaml.safe_load_all(f):
                result = parse_objects(doc, source=path)
                slices += [o for o in result.objects if isinstance(o, EndpointSlice)]
    loop = asyncio.get_running_loop()
    closers = []
    for ip, port, proto in sorted(endpoints_of(slices)):
        identity = join_host_port(ip, port).encode()
        if proto is Protocol.TCP:
            server = await loop.create_server(lambda i=identity: TcpIdentity(i), ip, port,
                                              reuse_address=True)
            closers.append(server.close)
        elif proto is Protocol.UDP:
            transport, _ = await loop.create_datagram_endpoint(
                lambda i=identity: UdpIdentity(i), local_addr=(ip, port))
            closers.append(transport.close)
    print(f"ready {len(closers)}", flush=True)
    try:
        await stop.wait()
    finally:
        for close in closers:
            close()


def main() -> None:
    """Run the backends of the manifests named on the command line.

    With ``--exit-with-parent`` they also stop when standard input reaches EOF, which happens
    when the parent that holds the other end of the pipe exits, however it exits.
    """
    args = sys.argv[1:]
    with_parent = "--exit-with-parent" in args
    paths = [a for a in args if a != "--exit-with-parent"] or ["examples/cluster.yaml"]

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if with_parent:
            loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.buffer.read1(4096) or stop.set())
        await serve(paths, stop)

    asyncio.run(run())


if __name__ == "__main__":
    main()
