# ruff: noqa: E501  (long command lines are kept whole to stay readable)
"""The flags every command shares: --version, help texts, negative durations, -f/--manifests -, --node-zone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy.cli.main import main
from kproxy.modes import run_modes
from tests.unit.cli.trace_shares import address_shares

ROOT = Path(__file__).resolve().parents[3]

ZONED = """\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: demo}
spec:
  clusterIP: 10.96.5.5
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: demo, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.1.0.1], zone: zone-a, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.1.0.2], zone: zone-b, hints: {forZones: [{name: zone-b}]}}
"""
NODE = ["--hostname-override", "node-a", "--node-ip", "192.168.0.2", "--cluster-cidr", "10.0.0.0/8"]


def _kproxy(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the ``kproxy`` console script as a real process."""
    return subprocess.run([str(Path(sys.executable).parent / "kproxy"), *argv], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=False)


@pytest.fixture
def zoned(tmp_path: Path) -> Path:
    path = tmp_path / "zoned.yaml"
    path.write_text(ZONED)
    return path


def test_version_prints_the_package_version() -> None:
    """`kproxy --version` prints `kproxy VERSION` on stdout and exits 0."""
    from importlib.metadata import version

    proc = _kproxy("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"kproxy {version('kproxy')}"


def test_log_format_and_log_level_have_help_texts(capsys: pytest.CaptureFixture[str]) -> None:
    """`kproxy run --help` explains --log-format's two formats and --log-level's meaning."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--log-format {console,json} console: one readable line per event" in text
    assert "--log-level {debug,info,warning,error} the least severe events logged" in text


def test_run_proxy_mode_choices_come_from_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    """`run --proxy-mode` offers exactly the registered modes that run (a render-only mode is not offered)."""
    with pytest.raises(SystemExit):
        main(["run", "--proxy-mode", "nope"])
    assert f"(choose from {', '.join(repr(m) for m in run_modes())})" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--min-sync-period", "--sync-period", "--udp-timeout", "--drain-timeout"])
def test_a_negative_duration_is_the_duration_error(flag: str) -> None:
    """`--min-sync-period -1s` (a separate word) exits 2 with the duration error, not "expected one argument"."""
    proc = _kproxy("run", "--manifests", "examples/cluster.yaml", flag, "-1s")
    assert proc.returncode == 2, proc.stderr
    assert f"kproxy: {flag}: expected a duration >= 0, got '-1s'" in proc.stderr
    assert "expected one argument" not in proc.stderr


def test_render_reads_manifests_from_stdin_as_from_a_file(zoned: Path) -> None:
    """`kproxy render -f -` with the YAML piped in prints what `--manifests FILE` prints."""
    from_file = _kproxy("render", "--manifests", str(zoned), *NODE)
    piped = _kproxy("render", "-f", "-", *NODE, stdin=zoned.read_text())
    assert from_file.returncode == piped.returncode == 0, piped.stderr
    assert piped.stdout == from_file.stdout and "demo/web:http" in piped.stdout


def test_render_reads_a_json_list_from_stdin(zoned: Path) -> None:
    """`kubectl get -o json` output (a List) piped into `render --manifests -` renders its Services."""
    import yaml

    doc = {"apiVersion": "v1", "kind": "List", "items": list(yaml.safe_load_all(ZONED))}
    proc = _kproxy("render", "--manifests", "-", *NODE, stdin=json.dumps(doc))
    assert proc.returncode == 0, proc.stderr
    assert "demo/web:http cluster IP\" -m tcp -p tcp -d 10.96.5.5 --dport 80 -j KUBE-SVC-" in proc.stdout


def test_a_syntax_error_on_stdin_is_a_warning_naming_stdin() -> None:
    """Broken YAML on standard input is reported as <stdin>, and nothing is rendered for it."""
    proc = _kproxy("render", "-f", "-", stdin="kind: [\n")
    assert proc.returncode == 0 and "kproxy: warning: <stdin>: YAML/JSON syntax error" in proc.stderr


def _endpoint_chains(text: str) -> int:
    return len({line.split()[0] for line in text.splitlines() if line.startswith(":KUBE-SEP-")})


@pytest.mark.parametrize(("zone", "chains"), [([], 2), (["--node-zone", "zone-a"], 1)])
def test_render_node_zone_applies_topology_hints(zoned: Path, zone: list[str], chains: int) -> None:
    """With --node-zone zone-a only the endpoint hinted for zone-a is programmed; without it, both."""
    proc = _kproxy("render", "--manifests", str(zoned), *NODE, *zone)
    assert proc.returncode == 0, proc.stderr
    assert _endpoint_chains(proc.stdout) == chains


@pytest.mark.parametrize(("zone", "endpoints"), [
    ([], [{"address": "10.1.0.1:8080", "probability": 0.5}, {"address": "10.1.0.2:8080", "probability": 0.5}]),
    (["--node-zone", "zone-b"], [{"address": "10.1.0.2:8080", "probability": 1.0}]),
])
def test_trace_node_zone_applies_topology_hints(zoned: Path, zone: list[str], endpoints: list[dict[str, object]],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`trace --node-zone zone-b` reaches only the zone-b endpoint; without it both, half each."""
    assert main(["trace", "--manifests", str(zoned), *NODE, *zone, "--src", "10.0.0.5", "--dst", "10.96.5.5:80", "--json"]) == 0
    assert address_shares(json.loads(capsys.readouterr().out)["endpoints"]) == endpoints


def test_verify_takes_node_zone(zoned: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`verify --node-zone zone-a` checks the modes with the zone's hints applied, and they agree."""
    assert main(["verify", "--manifests", str(zoned), *NODE, "--node-zone", "zone-a", "--examples", "60"]) == 0
    assert "agree on 60 packets" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["render"], ["trace", "--src", "10.0.0.5", "--dst", "10.96.5.5:80"], ["verify", "--examples", "20"]])
def test_every_command_takes_the_same_node_flags(zoned: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """render, trace and verify accept repeated --node-ip (two per family), --node-zone and --ip-family alike."""
    flags = ["--hostname-override", "node-a", "--node-ip", "192.168.0.2", "--node-ip", "192.168.1.2",
             "--node-zone", "zone-a", "--ip-family", "IPv4", "--cluster-cidr", "10.0.0.0/8"]
    assert main([command[0], "--manifests", str(zoned), *flags, *command[1:]]) == 0, capsys.readouterr().err


def test_trace_uses_every_node_ip_for_nodeports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A NodePort on the second --node-ip of a family is local to the node, as on the first."""
    path = tmp_path / "np.yaml"
    path.write_text(ZONED.replace("clusterIP: 10.96.5.5\n", "clusterIP: 10.96.5.5\n  type: NodePort\n")
                    .replace("targetPort: 8080}", "targetPort: 8080, nodePort: 30080}"))
    for ip in ("192.168.0.2", "192.168.1.2"):
        assert main(["trace", "--manifests", str(path), "--node-ip", "192.168.0.2", "--node-ip", "192.168.1.2",
                     "--src", "203.0.113.9", "--dst", f"{ip}:30080", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["verdict"] == "ACCEPT"
