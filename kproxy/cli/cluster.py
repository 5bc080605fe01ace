"""``kproxy cluster serve``: an API server for harnesses, on loopback, from manifests.

Parsing and printing only; the work is :class:`kproxy.cluster.ClusterServer`. It prints
``serving on http://HOST:PORT`` once listening (and writes the kubeconfig first, when asked), then
runs until SIGINT or SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from kproxy.cluster import ClusterServer
from kproxy.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``cluster serve`` on the ``kproxy`` subparsers."""
    parser = sub.add_parser("cluster", help="an API server for harnesses (cluster serve)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    serve = verbs.add_parser(
        "serve", help="serve manifests as a Kubernetes API server",
        description="Serve the manifests' Namespaces, Services, EndpointSlices, Pods and Nodes over "
                    "HTTP with list, watch and discovery, and pods/portforward (SPDY/3.1 and its "
                    "WebSocket tunnel), so kubectl and kproxy run --kubeconfig talk to it. Edits to "
                    "the manifests are served live.")
    serve.add_argument("-f", "--manifests", nargs="+", metavar="PATH", required=True,
                       help="YAML or JSON files or folders (kind: List too); edits are served live")
    serve.add_argument("--listen", metavar="IP:PORT", default="127.0.0.1:0",
                       help="where to listen (default 127.0.0.1:0, a free port)")
    serve.add_argument("--write-kubeconfig", metavar="FILE", help="write a kubeconfig for this server")
    serve.add_argument("--kubernetes-version", metavar="1.MINOR", default="1.33",
                       help="the version /version reports (kubectl's dispatcher picks its binary by it)")
    serve.add_argument("--log-format", choices=("console", "json"), default="console")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    serve.set_defaults(handler=run, subparser=serve)


def _listen(raw: str) -> tuple[str, int]:
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--listen {raw!r}: expected IP:PORT, e.g. 127.0.0.1:6443")
    return host.strip("[]") or "127.0.0.1", int(port)


def _minor(raw: str) -> int:
    major, _, minor = raw.lstrip("v").partition(".")
    if major != "1" or not minor.split(".")[0].isdigit():
        raise ConfigError(f"--kubernetes-version {raw!r}: expected 1.MINOR, e.g. 1.33")
    return int(minor.split(".")[0])


async def _main(args: argparse.Namespace) -> int:
    host, port = _listen(args.listen)
    server = ClusterServer([str(p) for p in args.manifests], kube_minor=_minor(args.kubernetes_version))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        url = await server.start(host, port)
    except OSError as err:
        raise ConfigError(f"--listen {args.listen}: {err.strerror or err}") from err
    try:
        if args.write_kubeconfig:
            server.write_kubeconfig(args.write_kubeconfig)
        print(f"serving on {url}", flush=True)
        await stop.wait()
    finally:
        await server.aclose()
    return 0


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Serve until SIGINT or SIGTERM.

    Runs on uvloop when it is installed (as ``kproxy run``), else on asyncio's loop.
    """
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_main(args))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_main(args))
