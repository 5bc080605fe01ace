"""``kproxy port-forward``: kubectl's command, over one multiplexed upgraded connection.

Parsing and printing only; the work is :func:`kproxy.portforward.client.port_forward`. Output
and exit codes follow kubectl: ``Forwarding from ADDRESS:LOCAL -> REMOTE`` per listener,
``Handling connection for LOCAL`` per connection, errors of one connection on stderr (the forward
goes on, unlike kubectl), and ``error: lost connection to pod`` with exit status 1 when the
upgraded connection ends (the Pod went away).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from kproxy.errors import PortForwardError
from kproxy.portforward.client import port_forward
from kproxy.portforward.http import load_kubeconfig

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``port-forward`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser(
        "port-forward", help="forward local ports to a pod (kubectl's syntax)",
        description="Forward one or more local ports to a pod, as kubectl port-forward does: "
                    "TYPE/NAME is pod/NAME, NAME or svc/NAME (a ready pod of the Service, its target "
                    "ports); ports are [LOCAL:]REMOTE, ':REMOTE' picks a free local port. Every "
                    "local connection shares one upgraded connection (the WebSocket tunnel, or "
                    "SPDY/3.1 when the server refuses it).")
    parser.add_argument("target", metavar="TYPE/NAME")
    parser.add_argument("ports", metavar="[LOCAL:]REMOTE", nargs="+")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="the kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("-n", "--namespace", metavar="NS", help="the namespace (default: the context's)")
    parser.add_argument("--address", metavar="IP", default="localhost",
                        help="comma-separated addresses to listen on (default localhost: 127.0.0.1 and ::1)")
    parser.add_argument("--no-tunnel", action="store_true",
                        help="speak SPDY/3.1 only (as KUBECTL_PORT_FORWARD_WEBSOCKETS=false)")
    parser.set_defaults(handler=run, subparser=parser)


def _addresses(raw: str) -> tuple[str, ...]:
    out: list[str] = []
    for word in (w.strip() for w in raw.split(",") if w.strip()):
        out += ["127.0.0.1", "::1"] if word == "localhost" else [word]
    return tuple(out)


async def _main(args: argparse.Namespace) -> int:
    endpoint = load_kubeconfig(args.kubeconfig)

    def on_error(local: int, remote: int, message: str) -> None:
        print(f"error: {message}", file=sys.stderr, flush=True)

    def on_connection(local: int) -> None:
        print(f"Handling connection for {local}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with port_forward(endpoint, args.target, args.ports, namespace=args.namespace,
                                addresses=_addresses(args.address), tunnel=not args.no_tunnel,
                                on_connection=on_connection, on_error=on_error) as fwd:
            for port in fwd.ports:
                host = f"[{port.address}]" if ":" in port.address else port.address
                print(f"Forwarding from {host}:{port.local} -> {port.remote}", flush=True)
            lost = asyncio.ensure_future(fwd.lost.wait())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({lost, stopped}, return_when=asyncio.FIRST_COMPLETED)
            lost.cancel()
            stopped.cancel()
            if fwd.lost.is_set() and not stop.is_set():
                print("error: lost connection to pod", file=sys.stderr, flush=True)
                return 1
    except PortForwardError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the forward until SIGINT/SIGTERM (0) or until the Pod goes away (1).

    Runs on uvloop when it is installed (as ``kproxy run``), else on asyncio's loop.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_main(args))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_main(args))
