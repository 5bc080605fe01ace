"""The ``kproxy`` command line."""

from kproxy.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
