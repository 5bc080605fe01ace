"""A fake Kubernetes API server (aiohttp, loopback) that kubernetes-asyncio talks to over TCP."""

from tests.fakeapi.objects import endpoint_slice, node, rfc3339, service
from tests.fakeapi.server import FakeApiServer, RequestRecord

__all__ = ["FakeApiServer", "RequestRecord", "endpoint_slice", "node", "rfc3339", "service"]
