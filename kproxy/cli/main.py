"""The ``kproxy`` command: argument parsing and printing only; the work happens in the library.

Flags follow kube-proxy's names where one exists (``--proxy-mode``, ``--hostname-override``,
``--min-sync-period``, ``--sync-period``, ``--bind-address``). Each command parses its flags,
builds the one :class:`~kproxy.config.RunConfig` from them (:func:`kproxy.config.build_run_config`)
and hands it over.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import metadata

import structlog

from kproxy.cli import cluster, nodedump, portforward, render, run, trace, verify
from kproxy.cli.flags import join_negative_values
from kproxy.errors import ConfigError, KproxyError
from kproxy.observability import configure_logging

__all__ = ["build_parser", "main", "version"]


def version() -> str:
    """The installed kproxy's version (the package metadata, else the source tree's)."""
    try:
        return metadata.version("kproxy")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every ``kproxy`` subcommand."""
    parser = argparse.ArgumentParser(
        prog="kproxy",
        description="Kubernetes Service proxying, as kube-proxy does it, in Python.",
    )
    parser.add_argument("--version", action="version", version=f"kproxy {version()}",
                        help="print kproxy's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.add_parser(sub)
    render.add_parser(sub)
    trace.add_parser(sub)
    verify.add_parser(sub)
    portforward.add_parser(sub)
    cluster.add_parser(sub)
    nodedump.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kproxy`` console script; returns the exit status.

    Exit status: 0 on success (and after a clean SIGINT/SIGTERM), 2 for a usage or
    configuration error (the message names the flag or file), 1 for any other kproxy error.
    """
    parser = build_parser()
    words = join_negative_values(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(words)
    configure_logging(getattr(args, "log_format", "console"), level=getattr(args, "log_level", "info"))
    try:
        return int(args.handler(args, args.subparser))
    except ConfigError as err:
        print(f"kproxy: {err}", file=sys.stderr)
        return 2
    except KproxyError as err:
        structlog.get_logger("kproxy").error("fatal", error=str(err))
        if getattr(args, "log_format", "console") != "json":
            print(f"kproxy: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
