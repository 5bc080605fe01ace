"""Build the node a trace runs through: from manifests (rendered by a mode) or from a node's dumps.

``kproxy trace``, ``kproxy verify`` and :mod:`kproxy.testing` share these: manifests are read
once (``-`` is standard input, as kubectl's ``-f -``), turned into this node's Snapshot with the
run configuration's node (name, zone, families), rendered with the mode's configuration built
``from_run`` and loaded into an emulated node; a node's ``iptables-save`` or ``ipvsadm-save``
dumps are loaded leniently instead (an unmodelled match is reported as unknown, never taken).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from emulation import ManualClock
from emulation.errors import NetfilterError
from emulation.netfilter import Netns, Ruleset, load
from kproxy.config.defaults import STDIN_PATH
from kproxy.config.run import RunConfig
from kproxy.errors import ConfigError, InvalidObject, SourceError
from kproxy.kernel.emulated import EmulatedNetfilter
from kproxy.kernel.ipvs_node import IpvsNode
from kproxy.kernel.node import trace_node
from kproxy.model import EndpointSlice, IPFamily, KubeObject, Service, Snapshot, build_snapshot, parse_objects
from kproxy.modes.iptables import IptablesConfig, IptablesRenderer, nfacct_counters
from kproxy.modes.iptables.mode import load_now
from kproxy.modes.ipvs import IpvsConfig, render
from kproxy.sources._gcpause import collector_paused
from kproxy.sources.manifests import Progress, load_manifests
from kproxy.sources.yamlfast import load_all as yaml_load_all
from kproxy.trace.ipvs import node_from_render
from kproxy.trace.netfilter import find_chain_loop

__all__ = [
    "STDIN_SOURCE",
    "Manifests",
    "check_node_dump",
    "iptables_netns",
    "ipvs_node",
    "load_node_dump",
    "netns_from_dump",
    "parse_manifest_text",
    "read_manifests",
    "read_text",
    "snapshot_of",
]

#: What problems found in standard input name as their file.
STDIN_SOURCE = "<stdin>"



@dataclass(frozen=True, slots=True, kw_only=True)
class Manifests:
    """The objects of ``--manifests`` read once.

    Attributes:
        services, slices: the valid objects (one per kind, namespace and name).
        problems: every problem, as :func:`kproxy.sources.manifests.load_manifests` reports them.
    """

    services: tuple[Service, ...]
    slices: tuple[EndpointSlice, ...]
    problems: tuple[InvalidObject | SourceError, ...]


def parse_manifest_text(
    text: str, *, source: str = STDIN_SOURCE,
) -> tuple[list[KubeObject], list[InvalidObject | SourceError]]:
    """The objects of a YAML or JSON stream (``kubectl get -o yaml``/``-o json`` output, several documents).

    Returns:
        ``(objects, problems)``; a syntax error is one :class:`SourceError` problem naming the line.
    """
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            decoder = json.JSONDecoder()
            docs: list[Any] = []
            pos = 0
            while pos < len(stripped):
                doc, pos = decoder.raw_decode(stripped, pos)
                docs.append(doc)
                while pos < len(stripped) and stripped[pos].isspace():
                    pos += 1
        else:
            docs = list(yaml_load_all(text))
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        detail = " ".join(str(err).split())
        return [], [SourceError(f"{source}: YAML/JSON syntax error, input skipped: {detail}")]
    objects: list[KubeObject] = []
    problems: list[InvalidObject | SourceError] = []
    several = len([d for d in docs if d is not None]) > 1
    for i, doc in enumerate(docs, start=1):
        result = parse_objects(doc, source=source, where=f"document {i}" if several else "")
        objects.extend(result.objects)
        problems.extend(result.problems)
    return objects, problems


def read_manifests(paths: Sequence[str], *, stdin: TextIO | None = None,
                   progress: Progress | None = None) -> Manifests:
    """Read ``--manifests`` once: files, folders and ``-`` (standard input), later definitions winning;
    ``progress`` hears of each YAML document read from a file (a progress bar).

    Raises:
        ConfigError: no path, or a path that does not exist (naming ``--manifests`` and the path).
    """
    if not paths:
        raise ConfigError("--manifests: give at least one file or folder (or - for standard input)")
    files = [p for p in paths if p != STDIN_PATH]
    for path in files:
        if not Path(path).exists():
            raise ConfigError(f"--manifests: {path!r} does not exist; expected a file or a folder")
    objects: dict[tuple[str, str, str], KubeObject] = {}
    problems: list[InvalidObject | SourceError] = []
    for path in paths:
        if path == STDIN_PATH:
            found, trouble = parse_manifest_text((stdin or sys.stdin).read())
        else:
            try:
                found, trouble = load_manifests([path], progress=progress)
            except SourceError as err:
                raise ConfigError(f"--manifests: {err}") from None
        problems.extend(trouble)
        for obj in found:
            objects[(type(obj).__name__, obj.namespace, obj.name)] = obj
    return Manifests(services=tuple(o for o in objects.values() if isinstance(o, Service)),
                     slices=tuple(o for o in objects.values() if isinstance(o, EndpointSlice)),
                     problems=tuple(problems))


def snapshot_of(run: RunConfig, manifests: Manifests) -> Snapshot:
    """This node's Snapshot of ``manifests`` (the run configuration's node name, zone and families)."""
    with collector_paused():  # as load_manifests: many objects, no full collections meanwhile
        return build_snapshot(list(manifests.services), list(manifests.slices),
                              run.node.node_config(run.source.service_proxy_name))


def read_text(path: str, flag: str) -> str:
    """The UTF-8 text of the file ``path`` given with ``flag``.

    Raises:
        ConfigError: the file cannot be read or is not UTF-8 text (naming the flag and file).
    """
    try:
        return Path(path).read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"{flag}: cannot read {path!r}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{flag} {path}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset "
                          f"{err.start}; give the text iptables-save prints)") from None


def netns_from_dump(path: str, version: int, node_ips: Iterable[str], *,
                    flag: str = "--iptables-save") -> Netns:
    """An emulated node holding a real node's ``iptables-save`` dump, read leniently.

    Raises:
        ConfigError: the file cannot be read, does not parse, or has a chain loop (naming it).
    """
    text = read_text(path, flag)
    try:
        ruleset = load(text, version=version, strict=False)
    except NetfilterError as err:
        raise ConfigError(f"{flag} {path}: {err}") from None
    loop = find_chain_loop(ruleset)
    if loop is not None:
        raise ConfigError(f"{flag} {path}: {loop}")
    return Netns(trace_node(list(node_ips)), ManualClock(), ruleset=ruleset)


def iptables_netns(run: RunConfig, snapshot: Snapshot, family: IPFamily) -> Netns:
    """An emulated node after the iptables mode's full sync of ``snapshot`` (jump rules and nfacct included).

    Raises:
        KernelError: the rendered rules do not load (a bug: please report it).
    """
    config = IptablesConfig.from_run(run, family)
    result = IptablesRenderer(config).render(snapshot)
    version = 6 if family is IPFamily.IPv6 else 4
    netns = Netns(trace_node(config.node_ips), ManualClock(), ruleset=Ruleset(version))
    load_now(EmulatedNetfilter(netns, family), result, nfacct=nfacct_counters(config))
    return netns


def ipvs_node(run: RunConfig, snapshot: Snapshot, family: IPFamily) -> IpvsNode:
    """An emulated IPVS node after the ipvs mode's full sync of ``snapshot``."""
    config = IpvsConfig.from_run(run, family)
    return node_from_render(render(snapshot, config), list(run.node.node_ips))


_JUMP_TO_SERVICES = re.compile(r"^(?:\[\d+:\d+\]\s+)?-A\s+(PREROUTING|OUTPUT)\s.*-j\s+KUBE-SERVICES(\s|$)")


def check_node_dump(path: str, text: str) -> None:
    """Refuse an empty dump, and one with KUBE chains but no jump into them (``kproxy render`` output).

    Raises:
        ConfigError: saying which, and what to give instead.
    """
    lines = [line.strip() for line in text.splitlines()]
    if not any(line and not line.startswith("#") for line in lines):
        raise ConfigError(f"--iptables-save {path}: the file is empty; give a node's iptables-save output")
    table = ""
    kube = jumps = False
    for line in lines:
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":KUBE-"):
            kube = True
        elif table == "nat" and _JUMP_TO_SERVICES.match(line):
            jumps = True
    if kube and not jumps:
        raise ConfigError(f"--iptables-save {path}: the dump has no jump rules into KUBE-SERVICES: was it "
                          "made with `kproxy render`? A node's `iptables-save` has them (kube-proxy "
                          "installs the jumps from PREROUTING and OUTPUT outside its restore)")


def load_node_dump(path: str, family: IPFamily) -> Ruleset:
    """A node's ``iptables-save`` dump for comparison (``kproxy verify --iptables-save``), read leniently.

    Raises:
        ConfigError: unreadable, empty, rendered (no jump rules) or not parsing (naming the file).
    """
    text = read_text(path, "--iptables-save")
    check_node_dump(path, text)
    try:
        return load(text, version=6 if family is IPFamily.IPv6 else 4, strict=False)
    except NetfilterError as err:
        raise ConfigError(f"--iptables-save {path}: {err}") from None
