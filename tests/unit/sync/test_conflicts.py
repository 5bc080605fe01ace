"""Two Services on one ClusterIP and port are reported, naming both objects and their files."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from kproxy.model import NodeConfig, Snapshot
from kproxy.sources.manifests import ManifestSource, load_manifests
from kproxy.sync import SyncEngine
from tests.unit.sync.builders import running


def _svc(name: str, ip: str, port: int = 80) -> str:
    return (f"apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\n"
            f"spec: {{clusterIP: {ip}, ports: [{{port: {port}}}]}}\n")


class _Keep:
    """A consumer that keeps the last Snapshot."""

    def __init__(self) -> None:
        self.last: Snapshot | None = None

    async def apply(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot``."""
        self.last = snapshot


async def test_a_shared_cluster_ip_and_port_is_warned_once_naming_both_services_and_files(
        tmp_path: Path) -> None:
    """web and shop share 10.96.0.10:80: one warning names both, both files, and the first in order."""
    (tmp_path / "a.yaml").write_text(_svc("web", "10.96.0.10"))
    (tmp_path / "b.yaml").write_text(_svc("shop", "10.96.0.10") + "---\n" + _svc("other", "10.96.0.10", 81))
    source = ManifestSource([tmp_path], parse_in_thread=False, poll_interval_s=0.05)
    engine = SyncEngine(source, NodeConfig(hostname="n"), [_Keep()], min_sync_period_s=0.0, sync_period_s=0.1)
    with capture_logs() as logs:
        async with running(engine.run):
            await engine.wait_synced(3)  # several periodic syncs: still one warning
    warnings = [e for e in logs if "same ClusterIP" in e["event"]]
    assert len(warnings) == 1, warnings
    warning = warnings[0]
    assert warning["address"] == "10.96.0.10:80/TCP"
    assert warning["services"] == ["default/shop", "default/web"]
    assert warning["files"] == [str(tmp_path / "b.yaml"), str(tmp_path / "a.yaml")]
    assert warning["first"] == "default/shop"
    assert engine.tracker.conflicts and len(engine.tracker.conflicts) == 1


def test_a_service_without_spec_is_reported(tmp_path: Path) -> None:
    """A Service with no spec is a problem naming the file, the object and the spec field."""
    path = tmp_path / "s.yaml"
    path.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: bare}\n")
    objects, problems = load_manifests([path])
    assert objects == []
    assert len(problems) == 1
    text = str(problems[0])
    assert str(path) in text and "Service default/bare" in text and "spec" in text


def test_a_duplicate_names_the_document_index_in_each_file(tmp_path: Path) -> None:
    """web in a.yaml (its only document) and b.yaml (document 2): both indexes are named."""
    (tmp_path / "a.yaml").write_text(_svc("web", "10.96.0.10"))
    (tmp_path / "b.yaml").write_text(_svc("db", "10.96.0.11") + "---\n" + _svc("web", "10.96.0.12"))
    _, problems = load_manifests([tmp_path])
    texts = [str(p) for p in problems]
    assert len(texts) == 1
    assert f"{tmp_path / 'a.yaml'} document 1" in texts[0] and f"{tmp_path / 'b.yaml'} document 2" in texts[0]


def test_port_name_errors_name_the_file_once(tmp_path: Path) -> None:
    """A Service whose every port is invalid is one problem with the file path written once."""
    path = tmp_path / "p.yaml"
    path.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
                    "spec: {clusterIP: 10.96.0.10, ports: [{port: 80, name: Bad_Name}, {port: 81}]}\n")
    _, problems = load_manifests([path])
    assert len(problems) == 1
    text = str(problems[0])
    assert text.count(str(path)) == 1 and "spec.ports[0].name" in text and "spec.ports[1].name" in text
