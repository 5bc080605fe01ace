# ruff: noqa: E501  (long command lines and test names are kept whole to stay readable)
"""Defects users of the ``kproxy`` command reported, each pinned by the behaviour they asked for.

1. ipvs-only flags given to the iptables mode are ignored, as kube-proxy ignores them, but with
   one warning line on stderr naming them.
2. ``--nodeport-addresses`` (and ``nodePortAddresses`` in ``--config``) takes CIDRs or
   ``primary`` only, as kube-proxy's validation does: a bare IP is an error, not a silent ``/32``.
3. ``kproxy trace`` says which node address it used, and when it was the placeholder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.cli.main import main
from kproxy.config import load_configuration
from kproxy.errors import ConfigError
from kproxy.kernel.node import PLACEHOLDER_IPS
from tests.scenarios import NODE, NODE_IP, cluster
from tests.unit.cli.trace_shares import address_shares

ROOT = Path(__file__).resolve().parents[3]
DUMP = ROOT / "tests" / "emulation" / "data" / "node-dump.iptables-save"
NODE_FLAGS = ["--hostname-override", NODE, "--node-ip", NODE_IP, "--cluster-cidr", "10.0.0.0/8"]
CONFIG_HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster()}))
    return path


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("kproxy: warning:")]


# 1. ipvs-only flags in iptables mode ----------------------------------------------------------


def test_render_iptables_warns_once_about_ipvs_scheduler_and_renders_the_same(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`render --proxy-mode iptables --ipvs-scheduler wlc` succeeds, unchanged, with one warning naming the flag."""
    assert main(["render", "--manifests", str(manifests), "--proxy-mode", "iptables", *NODE_FLAGS]) == 0
    plain = capsys.readouterr()
    assert main(["render", "--manifests", str(manifests), "--proxy-mode", "iptables", *NODE_FLAGS, "--ipvs-scheduler", "wlc"]) == 0
    given = capsys.readouterr()
    assert given.out == plain.out
    assert _warnings(plain.err) == []
    assert _warnings(given.err) == ["kproxy: warning: --ipvs-scheduler only applies to --proxy-mode ipvs; ignored in iptables mode"]


def test_trace_iptables_names_every_ipvs_only_flag_in_one_line(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`trace` in iptables mode with --ipvs-scheduler and --connections: one warning naming both; the JSON is intact."""
    assert main(["trace", "--manifests", str(manifests), *NODE_FLAGS, "--ipvs-scheduler", "sh", "--connections", "5",
                 "--src", "10.0.0.2", "--dst", "172.30.0.41:80", "--json"]) == 0
    captured = capsys.readouterr()
    (warning,) = _warnings(captured.err)
    assert "--ipvs-scheduler" in warning and "--connections" in warning and "--proxy-mode ipvs" in warning
    assert address_shares(json.loads(captured.out)["endpoints"]) == [{"address": "10.180.0.1:8080", "probability": 1.0}]


def test_ipvs_mode_uses_the_iptables_group_flags_without_warning(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """kube-proxy's ipvs mode uses --cluster-cidr, --masquerade-all, --nodeport-addresses and the mark bit: no warning."""
    assert main(["render", "--manifests", str(manifests), "--proxy-mode", "ipvs", *NODE_FLAGS, "--ipvs-scheduler", "wlc",
                 "--masquerade-all", "--nodeport-addresses", "192.168.0.0/24", "--iptables-masquerade-bit", "13"]) == 0
    assert _warnings(capsys.readouterr().err) == []
    assert main(["trace", "--manifests", str(manifests), "--proxy-mode", "ipvs", *NODE_FLAGS, "--ipvs-scheduler", "wlc",
                 "--connections", "4", "--src", "10.0.0.2", "--dst", "172.30.0.41:80", "--json"]) == 0
    assert _warnings(capsys.readouterr().err) == []


def test_the_kproxy_process_prints_the_warning_on_stderr(manifests: Path) -> None:
    """A real `python -m kproxy render` process exits 0 and warns on stderr, not stdout."""
    proc = subprocess.run([sys.executable, "-m", "kproxy", "render", "--manifests", str(manifests), *NODE_FLAGS,
                           "--ipvs-scheduler", "lc"], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert _warnings(proc.stderr) == ["kproxy: warning: --ipvs-scheduler only applies to --proxy-mode ipvs; ignored in iptables mode"]
    assert "warning" not in proc.stdout and proc.stdout.startswith("*filter")


# 2. --nodeport-addresses: CIDRs or "primary" --------------------------------------------------


def _commands(manifests: Path) -> dict[str, list[str]]:
    m = str(manifests)
    return {
        "render": ["render", "--manifests", m, *NODE_FLAGS],
        "render-ipvs": ["render", "--manifests", m, "--proxy-mode", "ipvs", *NODE_FLAGS],
        "trace": ["trace", "--manifests", m, *NODE_FLAGS, "--src", "10.0.0.2", "--dst", "172.30.0.41:80"],
        "verify": ["verify", "--manifests", m, *NODE_FLAGS, "--examples", "1"],
        "run-userspace": ["run", "--manifests", m, "--proxy-mode", "userspace"],
        "run-iptables": ["run", "--manifests", m, "--proxy-mode", "iptables", "--node-ip", NODE_IP],
    }


def _kproxy(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the command as a real process; one that starts serving instead of refusing times out (a failure)."""
    return subprocess.run([sys.executable, "-m", "kproxy", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, check=False)


@pytest.mark.parametrize("command", ["render", "render-ipvs", "trace", "verify", "run-userspace", "run-iptables"])
def test_bare_ip_nodeport_address_is_a_usage_error(command: str, manifests: Path) -> None:
    """`--nodeport-addresses 192.168.0.2` exits 2 naming the flag and value, expecting CIDRs or "primary"."""
    proc = _kproxy([*_commands(manifests)[command], "--nodeport-addresses", "192.168.0.2"])
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("kproxy: --nodeport-addresses:")]
    assert "'192.168.0.2'" in line and "CIDRs" in line and '"primary"' in line and "192.168.0.2/32" in line


@pytest.mark.parametrize(("value", "bad"), [
    ("2001:db8::2", "'2001:db8::2'"),
    ("192.168.0.0/24,192.168.1.1", "'192.168.1.1'"),
    ("10.0.0.0/255.0.0.0", "'10.0.0.0/255.0.0.0'"),
    ("primary,10.0.0.0/8", "primary"),
    ("everywhere", "'everywhere'"),
])
def test_other_non_cidr_nodeport_addresses_are_refused(value: str, bad: str, manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bare IPv6 address, a bare IP among CIDRs, a netmask, "primary" with CIDRs and a word all exit 2 naming the value."""
    assert main([*_commands(manifests)["render"], "--nodeport-addresses", value]) == 2
    err = capsys.readouterr().err
    assert "--nodeport-addresses" in err and bad in err


@pytest.mark.parametrize("value", ["192.168.0.2/32", "192.168.0.0/24,2001:db8::/64", "192.168.0.5/24", "primary"])
def test_cidrs_and_primary_are_accepted(value: str, manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """CIDRs (host bits allowed, as Go's ParseCIDR) and "primary" render as before."""
    assert main([*_commands(manifests)["render"], "--nodeport-addresses", value]) == 0
    assert "KUBE-NODEPORTS" in capsys.readouterr().out


def test_config_file_bare_ip_is_refused_naming_the_file_and_field(tmp_path: Path) -> None:
    """nodePortAddresses: [192.168.0.2] in a KubeProxyConfiguration is a ConfigError naming the file, field and value."""
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(CONFIG_HEAD + "nodePortAddresses: [192.168.0.2]\n")
    with pytest.raises(ConfigError, match=r"kube-proxy\.yaml: nodePortAddresses: expected CIDRs.*'192\.168\.0\.2'.*192\.168\.0\.2/32"):
        load_configuration(path)


@pytest.mark.parametrize("value", ["192.168.0.2", "localhost", "all"])
def test_run_with_a_config_file_refuses_non_cidr_nodeport_addresses(value: str, manifests: Path, tmp_path: Path) -> None:
    """`run --config` with a non-CIDR nodePortAddresses exits 2 before serving (kube-proxy knows no localhost/all)."""
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(CONFIG_HEAD + f"mode: iptables\nnodePortAddresses: [{value}]\n")
    proc = _kproxy(["run", "--manifests", str(manifests), "--config", str(path)])
    assert proc.returncode == 2, proc.stderr
    assert f"--config {path}: nodePortAddresses:" in proc.stderr and repr(value) in proc.stderr


def test_config_file_primary_and_cidrs_are_accepted(tmp_path: Path) -> None:
    """nodePortAddresses of CIDRs, or of "primary" alone, load."""
    path = tmp_path / "kube-proxy.yaml"
    path.write_text(CONFIG_HEAD + "nodePortAddresses: [192.168.0.2/32, 'fd00::/64']\n")
    assert load_configuration(path).node_port_addresses == ("192.168.0.2/32", "fd00::/64")
    path.write_text(CONFIG_HEAD + "nodePortAddresses: [primary]\n")
    assert load_configuration(path).node_port_addresses == ("primary",)


# 3. trace names the node address it used ------------------------------------------------------


def _trace_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["trace", *args, "--json"]) == 0
    out: dict = json.loads(capsys.readouterr().out)  # type: ignore[type-arg]
    return out


def test_trace_text_says_the_node_address_is_a_placeholder(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --node-ip the second line names the placeholder and asks for --node-ip."""
    assert main(["trace", "--manifests", str(manifests), "--hostname-override", NODE, "--src", "10.0.0.2", "--dst", "172.30.0.41:80"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("packet: ")
    assert lines[1] == f"node address: {PLACEHOLDER_IPS[4]} (placeholder; pass --node-ip)"
    assert lines[2].startswith("verdict: ")


def test_trace_text_names_a_given_node_ip_without_the_placeholder_note(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --node-ip the line names it and says nothing of a placeholder."""
    assert main(["trace", "--manifests", str(manifests), *NODE_FLAGS, "--src", "10.0.0.2", "--dst", "172.30.0.41:80"]) == 0
    text = capsys.readouterr().out
    assert f"node address: {NODE_IP}\n" in text and "placeholder" not in text


def test_trace_json_adds_node_ips_and_placeholder_keeping_the_contract(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json adds node_ips and node_ip_placeholder; the documented fields keep their values."""
    base = ["--manifests", str(manifests), "--hostname-override", NODE, "--cluster-cidr", "10.0.0.0/8", "--src", "10.0.0.2", "--dst", "172.30.0.41:80"]
    guessed = _trace_json(capsys, *base)
    given = _trace_json(capsys, *base, "--node-ip", NODE_IP)
    assert (guessed["node_ips"], guessed["node_ip_placeholder"]) == ([PLACEHOLDER_IPS[4]], True)
    assert (given["node_ips"], given["node_ip_placeholder"]) == ([NODE_IP], False)
    for out in (guessed, given):
        assert {"verdict", "endpoints", "masquerade", "trace"} <= set(out)
        assert out["verdict"] == "ACCEPT" and address_shares(out["endpoints"]) == [{"address": "10.180.0.1:8080", "probability": 1.0}]


def test_trace_json_placeholder_is_per_family(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An IPv6 packet with only an IPv4 --node-ip uses the IPv6 placeholder, and says so."""
    out = _trace_json(capsys, "--manifests", str(manifests), *NODE_FLAGS, "--src", "2001:db8::9", "--dst", "[fd00::1]:80")
    assert (out["node_ips"], out["node_ip_placeholder"]) == ([PLACEHOLDER_IPS[6]], True)


def test_loopback_node_ip_still_leaves_a_placeholder(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A loopback --node-ip is not put on eth0, so the placeholder is used and reported."""
    out = _trace_json(capsys, "--manifests", str(manifests), "--node-ip", "127.0.0.1", "--src", "10.0.0.2", "--dst", "172.30.0.41:80")
    assert (out["node_ips"], out["node_ip_placeholder"]) == ([PLACEHOLDER_IPS[4]], True)


def test_dump_and_ipvs_traces_report_the_node_address_too(manifests: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--iptables-save and --proxy-mode ipvs traces carry the same two fields next to their own."""
    dump = _trace_json(capsys, "--iptables-save", str(DUMP), "--src", "203.0.113.9:999", "--dst", "10.96.0.1:443")
    assert (dump["node_ips"], dump["node_ip_placeholder"]) == ([PLACEHOLDER_IPS[4]], True)
    ipvs = _trace_json(capsys, "--manifests", str(manifests), "--proxy-mode", "ipvs", *NODE_FLAGS, "--src", "10.0.0.2", "--dst", "172.30.0.41:80")
    assert (ipvs["node_ips"], ipvs["node_ip_placeholder"]) == ([NODE_IP], False)
    assert {"virtual_server", "real_server", "notes"} <= set(ipvs)
