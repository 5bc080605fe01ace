"""Harness for the layer-7 end-to-end tests: HTTP pods, manifests, and `kproxy run --ingress-bind-address`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Pods:
    """Running HTTP pods: ``{pod name: ip}`` on one shared port."""

    port: int
    ips: dict[str, str]
    process: subprocess.Popen[str]


@contextlib.contextmanager
def http_pods(count: int, first_ip: str) -> Iterator[Pods]:
    """Start ``count`` pods (tests/e2e/http_backends.py) and stop them after."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.e2e.http_backends", "--pods", str(count),
                             "--first-ip", first_ip], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        info = json.loads(line)
        yield Pods(port=info["port"], ips=info["pods"], process=proc)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def service_docs(name: str, cluster_ip: str, pods: Mapping[str, str], port: int, *,
                 namespace: str = "default", port_name: str = "http", service_port: int = 80,
                 app_protocol: str | None = None) -> list[dict[str, Any]]:
    """A Service and its EndpointSlice with ``pods`` (``{pod: ip}``) ready on ``port``."""
    sport: dict[str, Any] = {"name": port_name, "port": service_port, "targetPort": port, "protocol": "TCP"}
    if app_protocol:
        sport["appProtocol"] = app_protocol
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
         "spec": {"clusterIP": cluster_ip, "ports": [sport]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{name}-1", "namespace": namespace,
                      "labels": {"kubernetes.io/service-name": name}},
         "addressType": "IPv4", "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
         "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "targetRef": {"name": pod}}
                       for pod, ip in sorted(pods.items())]},
    ]


def ingress_doc(name: str, rules: list[dict[str, Any]], *, annotations: Mapping[str, str] | None = None,
                namespace: str = "default", default_backend: dict[str, Any] | None = None,
                ingress_class: str | None = "nginx") -> dict[str, Any]:
    """An Ingress; ``rules`` as in the API."""
    spec: dict[str, Any] = {"rules": rules}
    if ingress_class:
        spec["ingressClassName"] = ingress_class
    if default_backend:
        spec["defaultBackend"] = default_backend
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
            "spec": spec}


def rule(host: str | None, *paths: tuple[str, str, str, int | str]) -> dict[str, Any]:
    """A rule: ``(path, pathType, service, port)`` tuples."""
    out: dict[str, Any] = {"http": {"paths": [
        {"path": p, "pathType": t, "backend": {"service": {
            "name": svc, "port": {"number": port} if isinstance(port, int) else {"name": port}}}}
        for p, t, svc, port in paths]}}
    if host:
        out["host"] = host
    return out


def write_manifests(path: Path, docs: list[dict[str, Any]]) -> None:
    """Write ``docs`` atomically (kproxy follows the file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump_all(docs))
    os.replace(tmp, path)


@dataclass
class Kproxy:
    """A `kproxy run` process with its ingress listener."""

    process: subprocess.Popen[bytes]
    listen: str
    log: Path
    extra: list[str] = field(default_factory=list)

    def url(self, path: str) -> str:
        """``http://<listener><path>``."""
        return f"http://{self.listen}{path}"


@contextlib.contextmanager
def kproxy_run(manifests: Path, tmp: Path, *extra: str) -> Iterator[Kproxy]:
    """Run `kproxy run -f manifests --ingress-bind-address 127.0.0.1:<free>` until the block ends."""
    port = free_port()
    listen = f"127.0.0.1:{port}"
    log = tmp / "kproxy.log"
    cmd = [str(Path(sys.executable).parent / "kproxy"), "run", "-f", str(manifests), "--hostname-override",
           "node-a", "--ingress-bind-address", listen, "--healthz-bind-address", "",
           "--metrics-bind-address", "", "--min-sync-period", "0", "--loopback-block", "127.62.0.0/16",
           *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"kproxy did not listen: {log.read_text()}") from None
                time.sleep(0.05)
        yield Kproxy(process=proc, listen=listen, log=log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get(url: str, *, headers: Mapping[str, str] | None = None,
        timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """One GET with urllib: ``(status, headers, body)`` (errors included)."""
    req = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers.items()), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers.items()), err.read()


def wait_until(check: Any, timeout_s: float = 10.0) -> Any:
    """Poll ``check()`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)
