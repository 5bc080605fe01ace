# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""Defects users reported about dumps, ignored flags and ``--nodeport-addresses``, each pinned by behaviour.

1. ``trace`` with a dump and a ``--proxy-mode`` it cannot mean is a usage error (exit 2) naming the
   flags and what to use instead, never a traceback; the meaningful combinations work.
2. Flags a dump makes pointless (it already holds the rules), and ``run --drain-timeout`` in
   iptables mode, are named in a warning instead of being silently dropped.
3. ``--nodeport-addresses`` is split as pflag's StringSlice splits it (CSV: blanks and empty
   elements kept) and each value is checked with ParseCIDRSloppy, in the flag and the file alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.cli.main import main
from kproxy.config import load_configuration
from kproxy.config.goparse import CsvError, parse_cidr_sloppy, read_csv_record
from kproxy.errors import ConfigError
from tests.scenarios import NODE, NODE_IP, cluster

ROOT = Path(__file__).resolve().parents[3]
DUMP = ROOT / "tests" / "emulation" / "data" / "node-dump.iptables-save"
IPVS_SAVE = "-A -t 10.96.0.10:80 -s rr\n-a -t 10.96.0.10:80 -r 10.0.1.1:80 -m -w 1\n"
PACKET = ["--node-ip", "192.168.0.2", "--src", "10.244.1.7", "--dst", "10.96.0.10:80"]
CONFIG_HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
RENDER_FLAGS = ["--cluster-cidr", "10.0.0.0/8", "--masquerade-all", "--hostname-override", "node-x",
                "--nodeport-addresses", "192.168.0.0/16", "--iptables-masquerade-bit", "13"]


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster()}))
    return path


@pytest.fixture
def ipvs_dump(tmp_path: Path) -> Path:
    path = tmp_path / "node.ipvsadm"
    path.write_text(IPVS_SAVE)
    return path


def _kproxy(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m kproxy ARGV`` as a real process."""
    return subprocess.run([sys.executable, "-m", "kproxy", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, check=False)


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("kproxy: warning:")]


# 1. dump flags and modes ----------------------------------------------------------------------


def test_iptables_dump_with_ipvs_mode_is_a_usage_error_not_a_traceback() -> None:
    """`trace --iptables-save F --proxy-mode ipvs` exits 2 naming both flags and advising --ipvs-dump or --manifests."""
    proc = _kproxy("trace", "--iptables-save", str(DUMP), "--proxy-mode", "ipvs", *PACKET)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("kproxy: --proxy-mode ipvs cannot trace --iptables-save FILE alone")
    assert "--ipvs-dump FILE" in line and "--manifests" in line and "drop --proxy-mode ipvs" in line


def test_ipvs_dump_with_iptables_mode_is_a_usage_error(ipvs_dump: Path) -> None:
    """`trace --ipvs-dump F --proxy-mode iptables` exits 2: the dump implies ipvs; use --iptables-save for an iptables node."""
    proc = _kproxy("trace", "--ipvs-dump", str(ipvs_dump), "--proxy-mode", "iptables", *PACKET)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--ipvs-dump FILE" in proc.stderr and "drop --proxy-mode iptables" in proc.stderr and "--iptables-save FILE alone" in proc.stderr


@pytest.mark.parametrize("mode", [[], ["--proxy-mode", "ipvs"]])
def test_ipvs_dump_with_the_nodes_iptables_dump_traces_through_ipvs(mode: list[str], ipvs_dump: Path) -> None:
    """--ipvs-dump plus --iptables-save (the node's remaining rules) traces the IPVS node, ipvs mode implied or given."""
    proc = _kproxy("trace", "--ipvs-dump", str(ipvs_dump), "--iptables-save", str(DUMP), *mode, *PACKET, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["real_server"] == "10.0.1.1:80" and _warnings(proc.stderr) == []


@pytest.mark.parametrize("dump_flag", ["--iptables-save", "--ipvs-dump"])
def test_a_dump_with_manifests_is_a_usage_error(dump_flag: str, manifests: Path, ipvs_dump: Path) -> None:
    """A dump and --manifests together exit 2 asking for one of them."""
    dump = DUMP if dump_flag == "--iptables-save" else ipvs_dump
    proc = _kproxy("trace", "--manifests", str(manifests), dump_flag, str(dump), *PACKET)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--manifests PATH..." in proc.stderr and dump_flag in proc.stderr


# 2. flags a dump or a mode does not use -------------------------------------------------------


def test_iptables_dump_names_the_render_flags_it_ignores_in_one_line() -> None:
    """With --iptables-save the five rendering flags change nothing and are named in one stderr warning."""
    plain = _kproxy("trace", "--iptables-save", str(DUMP), *PACKET, "--json")
    given = _kproxy("trace", "--iptables-save", str(DUMP), *PACKET, *RENDER_FLAGS, "--json")
    assert plain.returncode == given.returncode == 0, given.stderr
    assert given.stdout == plain.stdout
    assert _warnings(plain.stderr) == []
    assert _warnings(given.stderr) == [
        "kproxy: warning: --hostname-override, --cluster-cidr, --masquerade-all, --nodeport-addresses and "
        "--iptables-masquerade-bit ignored: --iptables-save FILE is a node's dump, which already holds the rules they would shape"]


def test_ipvs_dump_names_the_render_flags_and_scheduler_it_ignores(ipvs_dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --ipvs-dump, --cluster-cidr and --ipvs-scheduler are named in one warning; --connections is used, not named."""
    assert main(["trace", "--ipvs-dump", str(ipvs_dump), *PACKET, "--cluster-cidr", "10.0.0.0/8", "--ipvs-scheduler", "sh",
                 "--connections", "2", "--json"]) == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert line.startswith("kproxy: warning: --cluster-cidr and --ipvs-scheduler ignored: --ipvs-dump FILE")


def test_manifests_trace_uses_the_render_flags_without_warning(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """From --manifests the same flags shape the rules, so no warning is printed."""
    assert main(["trace", "--manifests", str(manifests), "--hostname-override", NODE, "--node-ip", NODE_IP,
                 "--cluster-cidr", "10.0.0.0/8", "--masquerade-all", "--nodeport-addresses", "192.168.0.0/16",
                 "--iptables-masquerade-bit", "13", "--src", "10.0.0.2", "--dst", "172.30.0.41:80"]) == 0
    assert _warnings(capsys.readouterr().err) == []


@pytest.mark.parametrize(("mode", "warned"), [("iptables", True), ("userspace", False)])
def test_run_warns_that_drain_timeout_is_userspace_only(mode: str, warned: bool) -> None:
    """`run --proxy-mode iptables --drain-timeout 3s` logs the flag as ignored (no connections to drain); userspace uses it."""
    proc = _kproxy("run", "--manifests", "/nonexistent/kproxy.yaml", "--log-format", "json", "--proxy-mode", mode,
                   "--drain-timeout", "3s")
    assert proc.returncode == 2, proc.stderr  # stops at the missing path, after the flag checks
    logged = [json.loads(line) for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("{")]
    assert any(e.get("flag") == "--drain-timeout" for e in logged) is warned


# 3. --nodeport-addresses as kube-proxy parses it ----------------------------------------------


@pytest.mark.parametrize(("value", "bad", "hint"), [
    ("10.0.0.0/8,", "''", "empty element"),
    ("10.0.0.0/8,,192.168.0.0/16", "''", "empty element"),
    ("10.0.0.0/8, 192.168.0.0/16", "' 192.168.0.0/16'", "keeps blanks"),
    ("fe80::1%eth0/64", "'fe80::1%eth0/64'", "zone"),
    ('10.0.0.0/8,1"0.0.0.0/8', "not a comma-separated list", "bare"),
])
def test_nodeport_addresses_flag_is_split_as_pflag_splits_it(value: str, bad: str, hint: str) -> None:
    """Trailing/doubled commas, blanks after a comma, an IPv6 zone and a bare quote exit 2 naming the flag and value."""
    proc = _kproxy("render", "--manifests", str(ROOT / "examples" / "cluster.yaml"), "--nodeport-addresses", value)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("kproxy: --nodeport-addresses:") and bad in line and hint in line


@pytest.mark.parametrize("value", ["010.0.0.0/8", '"10.0.0.0/8"', "010.001.000.000/008"])
def test_sloppy_cidrs_are_accepted_as_kube_proxy_accepts_them(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Leading zeros (ParseCIDRSloppy) and a CSV-quoted value render exactly as 10.0.0.0/8 does."""
    base = ["render", "--manifests", str(ROOT / "examples" / "cluster.yaml"), "--node-ip", "10.1.2.3"]
    assert main([*base, "--nodeport-addresses", "10.0.0.0/8"]) == 0
    canonical = capsys.readouterr().out
    assert main([*base, "--nodeport-addresses", value]) == 0
    assert capsys.readouterr().out == canonical
    assert "-d 10.1.2.3 -j KUBE-NODEPORTS" in canonical


def test_empty_flag_means_every_address(capsys: pytest.CaptureFixture[str]) -> None:
    """`--nodeport-addresses ""` is pflag's empty list: NodePorts on every local address, as with no flag."""
    examples = str(ROOT / "examples" / "cluster.yaml")
    assert main(["render", "--manifests", examples]) == 0
    plain = capsys.readouterr().out
    assert main(["render", "--manifests", examples, "--nodeport-addresses", ""]) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize(("values", "bad"), [
    ('["10.0.0.0/8", ""]', "''"),
    ('["10.0.0.0/8", " 192.168.0.0/16"]', "' 192.168.0.0/16'"),
    ('["fe80::1%eth0/64"]', "'fe80::1%eth0/64'"),
])
def test_config_file_refuses_what_the_flag_refuses(values: str, bad: str, tmp_path: Path) -> None:
    """nodePortAddresses with an empty, blank-padded or zoned value is refused naming the file, field and value."""
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(CONFIG_HEAD + f"nodePortAddresses: {values}\n")
    with pytest.raises(ConfigError, match=r"kube-proxy\.yaml: nodePortAddresses: expected CIDRs") as info:
        load_configuration(path)
    assert bad in str(info.value)


def test_config_file_accepts_leading_zeros_and_canonicalises(tmp_path: Path) -> None:
    """nodePortAddresses: [010.0.0.0/8] loads as 10.0.0.0/8, as ParseCIDRSloppy reads it."""
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(CONFIG_HEAD + "nodePortAddresses: ['010.0.0.0/8', 'fd00::5/64']\n")
    assert load_configuration(path).node_port_addresses == ("10.0.0.0/8", "fd00::5/64")


def test_run_refuses_a_trailing_comma_before_serving() -> None:
    """`run --nodeport-addresses 10.0.0.0/8,` exits 2 naming the flag, whatever the mode."""
    proc = _kproxy("run", "--manifests", str(ROOT / "examples" / "cluster.yaml"), "--nodeport-addresses", "10.0.0.0/8,")
    assert proc.returncode == 2, proc.stderr
    assert "kproxy: --nodeport-addresses:" in proc.stderr and "empty element" in proc.stderr


@pytest.mark.parametrize(("text", "fields"), [
    ("a,b", ["a", "b"]), ("a,", ["a", ""]), (" a , b", [" a ", " b"]), ('"a,b",c', ["a,b", "c"]),
    ('"a""b"', ['a"b']), ("a\nb", ["a"]), ("\n\na", ["a"]), ("a\r\n", ["a"]), ("", []),
])
def test_read_csv_record_matches_go_encoding_csv(text: str, fields: list[str]) -> None:
    """One record as Go's csv.Reader.Read returns it with default settings."""
    assert read_csv_record(text) == fields


@pytest.mark.parametrize("text", ['a"b', '"a', '"a"b', "\n"])
def test_read_csv_record_refuses_what_go_refuses(text: str) -> None:
    """A bare quote, an unterminated or badly closed quoted field, and no record are errors."""
    with pytest.raises(CsvError):
        read_csv_record(text)


@pytest.mark.parametrize(("text", "parsed"), [
    ("010.0.0.0/8", "10.0.0.0/8"), ("10.0.0.1/08", "10.0.0.1/8"), ("::ffff:1.2.3.4/104", None),
    ("2001:db8::/32", "2001:db8::/32"), ("0:0:0:0:0:0:0:1/128", "::1/128"),
])
def test_parse_cidr_sloppy_accepts_go_116_spellings(text: str, parsed: str | None) -> None:
    """Leading zeros in octets and prefix, embedded IPv4 and full IPv6 parse as Go 1.16's ParseCIDR does."""
    result = parse_cidr_sloppy(text)
    assert result is not None
    if parsed is not None:
        assert f"{result[0]}/{result[1]}" == parsed


@pytest.mark.parametrize("text", ["10.0.0.0", "10.0.0.0/33", "::/129", "10.0.0.256/8", "fe80::1%eth0/64", " 10.0.0.0/8",
                                  "10.0.0.0/8 ", "1::2::3/64", "10.0.0/8", "10.0.0.0/+8", "10.0.0.0/", "1:2:3:4:5:6:7:8:9/64"])
def test_parse_cidr_sloppy_refuses_what_go_refuses(text: str) -> None:
    """Bare addresses, prefixes out of range, bad octets, zones, blanks and malformed IPv6 are refused."""
    assert parse_cidr_sloppy(text) is None
