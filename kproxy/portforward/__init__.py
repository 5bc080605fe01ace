"""Port-forward: SPDY/3.1 framing, its WebSocket tunnel, the ``portforward.k8s.io`` stream protocol,
the client (``kproxy port-forward``) and the node-side bridge into a Pod's network namespace.

Sans-IO protocol cores with thin asyncio shells, as kubectl and the kubelet speak them.
"""
