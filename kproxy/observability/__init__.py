"""Logging (structlog), and later metrics and health endpoints."""

from kproxy.observability.logging import configure_logging

__all__ = ["configure_logging"]
