"""HTTP "pods" for the layer-7 end-to-end tests: one aiohttp server per pod on its own loopback IP.

Run as ``python -m tests.e2e.http_backends --pods 3 --first-ip 127.0.61.1``: prints one JSON line
``{"port": P, "pods": {"pod-0": "127.0.61.1", ...}}`` once every pod listens, then serves until
killed. Each pod answers:

* ``/...`` (any other path): ``pod=<name>`` with header ``X-Pod``; ``/headers``: the request
  headers as JSON; ``/page``: an HTML page naming the pod (for the browser);
* ``POST /upload``: the SHA-256 of the streamed body;
* ``GET /download?size=N``: ``N`` bytes of ``random.Random(N).randbytes(N)``, streamed chunked;
* ``/reset``: a response head promising 1000 bytes, 10 bytes, then a TCP reset;
* ``/ws``: a WebSocket echo prefixed with the pod name.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import json
import random
import socket
import sys

from aiohttp import WSMsgType, web


def _app(pod: str) -> web.Application:
    async def hello(request: web.Request) -> web.StreamResponse:
        return web.Response(text=f"pod={pod}", headers={"X-Pod": pod})

    async def headers(request: web.Request) -> web.StreamResponse:
        return web.json_response({"pod": pod, "headers": {k: v for k, v in request.headers.items()}})

    async def page(request: web.Request) -> web.StreamResponse:
        cookie = request.headers.get("Cookie", "")
        body = f"<html><body><p id='pod'>{pod}</p><p id='cookie'>{cookie}</p></body></html>"
        return web.Response(text=body, content_type="text/html", headers={"X-Pod": pod})

    async def upload(request: web.Request) -> web.StreamResponse:
        digest = hashlib.sha256()
        total = 0
        async for chunk in request.content.iter_any():
            digest.update(chunk)
            total += len(chunk)
        return web.json_response({"pod": pod, "sha256": digest.hexdigest(), "bytes": total})

    async def download(request: web.Request) -> web.StreamResponse:
        size = int(request.query["size"])
        data = random.Random(size).randbytes(size)
        resp = web.StreamResponse(headers={"X-Pod": pod})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        view = memoryview(data)
        for i in range(0, size, 1 << 20):
            await resp.write(bytes(view[i:i + (1 << 20)]))
        await resp.write_eof()
        return resp

    async def reset(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": "1000", "X-Pod": pod})
        await resp.prepare(request)
        await resp.write(b"0123456789")
        await asyncio.sleep(0.05)
        transport = request.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:  # SO_LINGER 0: close with a RST, as a crashing server does
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        transport.abort()
        return resp

    async def ws(request: web.Request) -> web.StreamResponse:
        sock = web.WebSocketResponse()
        await sock.prepare(request)
        async for msg in sock:
            if msg.type == WSMsgType.TEXT:
                await sock.send_str(f"{pod}:{msg.data}")
            elif msg.type == WSMsgType.BINARY:
                await sock.send_bytes(msg.data)
        return sock

    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/headers", headers)
    app.router.add_get("/page", page)
    app.router.add_post("/upload", upload)
    app.router.add_get("/download", download)
    app.router.add_get("/reset", reset)
    app.router.add_get("/ws", ws)
    app.router.add_route("*", "/{tail:.*}", hello)
    return app


def _free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


async def main(pods: int, first_ip: str) -> None:
    """Start ``pods`` pods on consecutive loopback IPs sharing one free port, print where, serve."""
    ips = [str(ipaddress.ip_address(first_ip) + i) for i in range(pods)]
    for _ in range(20):
        port = _free_port(ips[0])
        runners: list[web.AppRunner] = []
        try:
            for i, ip in enumerate(ips):
                runner = web.AppRunner(_app(f"pod-{i}"), access_log=None)
                await runner.setup()
                runners.append(runner)
                await web.TCPSite(runner, ip, port, backlog=1024).start()
            break
        except OSError:
            for r in runners:
                await r.cleanup()
    else:
        raise SystemExit("no common free port for the pods")
    print(json.dumps({"port": port, "pods": {f"pod-{i}": ip for i, ip in enumerate(ips)}}), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=3)
    parser.add_argument("--first-ip", default="127.0.61.1")
    args = parser.parse_args()
    try:
        asyncio.run(main(args.pods, args.first_ip))
    except KeyboardInterrupt:
        sys.exit(0)
