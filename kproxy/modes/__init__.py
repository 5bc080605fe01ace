"""The modes: each turns a :class:`~kproxy.model.Snapshot` into what one data plane needs.

Rendering is a pure function (snapshot in, text or state out); applying it is a thin,
separate step. ``kproxy.modes.iptables`` renders kube-proxy's ``iptables-restore`` input.
"""

__all__: list[str] = []
