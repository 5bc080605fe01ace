"""The debug endpoints of a ``--kernel emulated`` kernel-mode run (see :mod:`kproxy.observability.debug`).

:class:`KernelDebug` reads the live emulated kernels of the running modes, one per proxied family:
their rules in the kernel tools' formats (``iptables-save``; for the ipvs mode also
``ipvsadm-save -n`` and ``ipset save``; ``nft list table`` for the nftables mode), and a trace
of one packet through them, built exactly as ``kproxy trace`` builds it for a node's dumps
(:func:`~kproxy.trace.netfilter.trace_packet`, :func:`~kproxy.trace.ipvs.trace_ipvs`,
:func:`~kproxy.trace.nftables.trace_nftables`). A trace enumerates outcomes and changes nothing, so the
running node's counters and conntrack stay as its own traffic left them; it sees that state too
(an established flow's conntrack entry, a filled ``recent`` list).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence

from emulation.ipset import format_save
from emulation.ipvs import format_rules
from kproxy.errors import ConfigError
from kproxy.kernel import EmulatedIpvs, EmulatedNetfilter, EmulatedNftables, run_now
from kproxy.model import IPFamily
from kproxy.modes.iptables import IptablesMode
from kproxy.modes.ipvs.mode import IpvsMode
from kproxy.modes.nftables import NftablesMode
from kproxy.trace.ipvs import trace_ipvs
from kproxy.trace.netfilter import TraceResult, format_trace, make_packet, trace_packet
from kproxy.trace.nftables import trace_nftables

__all__ = ["DUMPS", "KernelDebug"]

#: The ``dump`` names ``/debug/rules`` takes, as the tool that prints each is called.
DUMPS = ("iptables-save", "ipvsadm-save", "ipset-save", "nft-ruleset")

Mode = IptablesMode | IpvsMode | NftablesMode


class KernelDebug:
    """``/debug/rules`` and ``/debug/trace`` over the running modes' emulated kernels.

    Args:
        modes: the modes of the run, one per family, each over an emulated kernel.
        node_ips: the run's node addresses (the trace tells a node-generated packet by them).

    Raises:
        ConfigError: a mode is not over an emulated kernel.
    """

    def __init__(self, modes: Sequence[Mode], node_ips: Sequence[str]) -> None:
        for mode in modes:
            if not isinstance(mode.kernel, EmulatedNetfilter | EmulatedIpvs | EmulatedNftables):
                raise ConfigError("the debug endpoints need --kernel emulated")
        self._modes = {mode.config.family: mode for mode in modes}
        self._node_ips = tuple(node_ips)

    def _dumps(self, mode: Mode) -> dict[str, str]:
        kernel = mode.kernel
        if isinstance(kernel, EmulatedNftables):
            return {"nft-ruleset": run_now(kernel.list_ruleset())}
        if isinstance(kernel, EmulatedIpvs):
            node = kernel.node
            return {"ipvsadm-save": format_rules(node.ipvs), "ipset-save": format_save(node.ipsets),
                    "iptables-save": node.netns.save(counters=True)}
        assert isinstance(kernel, EmulatedNetfilter)
        return {"iptables-save": kernel.netns.save(counters=True)}

    def rules(self, params: Mapping[str, str]) -> str:
        """The rules, all families and dumps or the ones ``family`` and ``dump`` name.

        Raises:
            ConfigError: an unknown family or dump, or a dump this mode has not.
        """
        family = params.get("family")
        if family is not None and family not in self._modes:
            raise ConfigError(f"family: expected one of {', '.join(self._modes)}, got {family!r}")
        dump = params.get("dump")
        if dump is not None and dump not in DUMPS:
            raise ConfigError(f"dump: expected one of {', '.join(DUMPS)}, got {dump!r}")
        out = []
        for fam, mode in self._modes.items():
            if family is not None and fam != family:
                continue
            dumps = self._dumps(mode)
            if dump is not None:
                if dump not in dumps:
                    raise ConfigError(f"dump: the {type(mode).__name__} has no {dump} (it has "
                                      f"{', '.join(dumps)})")
                if family is not None or len(self._modes) == 1:
                    return dumps[dump]
                dumps = {dump: dumps[dump]}
            out += [f"# {fam}: {name}\n{text}" for name, text in dumps.items()]
        return "".join(out)

    def trace(self, params: Mapping[str, str]) -> tuple[str, str]:
        """Trace ``src``, ``dst``, ``proto`` (default tcp) through the family's node; ``connections``
        (ipvs mode) simulates that many connections; ``format=text`` gives the text report.

        Returns:
            ``(content_type, body)``: JSON as ``kproxy trace --json`` prints it (with
            ``node_ips``), or the text report.

        Raises:
            ConfigError: a missing or malformed parameter, or a family this run does not proxy.
        """
        result = self.result(params)
        if params.get("format", "json") == "text":
            return "text/plain", format_trace(result)
        out = result.to_json()
        version = result.packet.version
        out["node_ips"] = [ip for ip in self._node_ips if ipaddress.ip_address(ip).version == version]
        return "application/json", json.dumps(out, indent=2) + "\n"

    def result(self, params: Mapping[str, str]) -> TraceResult:
        """The :class:`TraceResult` of :meth:`trace`.

        Raises:
            ConfigError: see :meth:`trace`.
        """
        fmt = params.get("format", "json")
        if fmt not in ("json", "text"):
            raise ConfigError(f"format: expected json or text, got {fmt!r}")
        missing = [name for name in ("src", "dst") if not params.get(name)]
        if missing:
            raise ConfigError(f"give {' and '.join(missing)} (src=IP[:PORT]&dst=IP:PORT&proto=tcp)")
        packet = make_packet(params["src"], params["dst"], params.get("proto", "tcp"), self._node_ips)
        family = IPFamily.IPv6 if packet.version == 6 else IPFamily.IPv4
        mode = self._modes.get(family)
        if mode is None:
            raise ConfigError(f"dst: this run proxies {', '.join(self._modes)} only, not {family}")
        text = params.get("connections", "1")
        if not text.isdigit() or int(text) < 1:
            raise ConfigError(f"connections: expected a whole number >= 1, got {text!r}")
        kernel = mode.kernel
        if isinstance(kernel, EmulatedNftables):
            if int(text) != 1:
                raise ConfigError("connections: only the ipvs mode simulates several connections")
            return trace_nftables(kernel.netns, packet)
        if isinstance(kernel, EmulatedIpvs):
            return trace_ipvs(kernel.node, packet, connections=int(text), zero_builtin_lines=True)
        if int(text) != 1:
            raise ConfigError("connections: only the ipvs mode simulates several connections")
        assert isinstance(kernel, EmulatedNetfilter)
        return trace_packet(kernel.netns, packet, zero_builtin_lines=True)
