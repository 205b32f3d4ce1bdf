"""The deployment files stay true: the compose overlay is what its generator writes, its
brokers form the VN tree and speak TLS with the certificates ``compose_gen.py keys`` issues,
Prometheus scrapes all of them, and the Grafana dashboard asks only for metrics (and labels)
that a running broker exports."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from cryptography import x509

from broker.daemon.config import load_config
from broker.tools.launcher import BrokerProcess
from broker.tools.local import fetch_text
from overlay.tree import Tree
from security.ca import Identity, identity_of, load_private_key, verify_issued

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"

# Labels Prometheus adds to every series it scrapes (deploy/compose/prometheus.yml adds vn).
SCRAPE_LABELS = {"job", "instance", "vn"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool"}


def load_compose_gen() -> ModuleType:
    """deploy/compose_gen.py (deploy/ holds scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("compose_gen", ROOT / "deploy/compose_gen.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("compose_gen", module)
    spec.loader.exec_module(module)
    return module


def test_committed_compose_files_are_what_the_generator_writes() -> None:
    gen = load_compose_gen()
    for path, text in gen.generated_files().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(ROOT)} is stale: run .venv/bin/python deploy/compose_gen.py"
        )


def compose_mounts(compose: str, keys_dir: Path) -> dict[str, dict[str, Path]]:
    """Each compose service's bind mounts, container path -> host path, with the keys
    directory variable set to ``keys_dir`` (named volumes left out)."""
    mounts: dict[str, dict[str, Path]] = {}
    service = ""
    compose = re.sub(r"\$\{TRELLIS_KEYS_DIR:-[^}]*\}", str(keys_dir), compose)
    for line in compose.splitlines():
        if match := re.fullmatch(r"  ([\w-]+):", line):
            service = match.group(1)
        elif match := re.fullmatch(r"      - ((?:\./|/)[^:\s]+):(/[^:]+)(?::ro)?", line):
            mounts.setdefault(service, {})[match.group(2)] = ROOT / match.group(1)
    return mounts


def compose_configs(keys_dir: Path) -> list[Any]:
    """Every compose broker's config as its container sees it: file paths in it (manifest,
    key, TLS files) read through the compose file's mounts of ``keys_dir``."""
    mounts = compose_mounts((ROOT / "docker-compose.yml").read_text(), keys_dir)
    configs = []
    for path in sorted(ROOT.glob("deploy/compose/*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        seen = mounts[path.stem]
        assert seen["/etc/trellis/broker.toml"] == path
        files = ("manifest", "key_file", "tls_cert", "tls_key", "tls_ca")
        for name in files:
            assert data.get(name) in seen, f"{path.name}: {name} = {data.get(name)!r} not mounted"
        configs.append(load_config(path, {n: seen[data[n]] for n in files}, environ={}))
    return configs


def test_compose_brokers_form_the_vn_tree_with_every_replica_linked(tmp_path: Path) -> None:
    gen = load_compose_gen()
    gen.write_keys(tmp_path)
    configs = compose_configs(tmp_path)
    assert len(configs) == 9, "3 VNs x 3 replicas"
    by_vn: dict[str, set[str]] = {}
    for config in configs:
        by_vn.setdefault(config.vn or config.id, set()).add(config.id)
    assert all(len(ids) == 3 for ids in by_vn.values()), by_vn
    vn_links = {tuple(sorted((c.vn or c.id, n.vn_id))) for c in configs for n in c.neighbours}
    tree = Tree(sorted(by_vn), vn_links)
    scrape = (ROOT / "deploy/compose/prometheus.yml").read_text()
    for config in configs:
        vn = config.vn or config.id
        assert config.host == "0.0.0.0"
        assert config.admin_port == 9100
        want = {b for n in tree.neighbours(vn) for b in by_vn[n]}
        assert {n.id for n in config.neighbours} == want
        # Brokers reach each other by compose service name.
        for entry in (*config.neighbours, *config.peers):
            assert entry.endpoint == f"{gen.service(entry.id)}:7700"
        assert config.key_file == tmp_path / f"{config.id}.key"
        assert f'"{gen.service(config.id)}:9100"' in scrape


def test_compose_brokers_speak_tls_with_certificates_for_their_manifest_keys(
    tmp_path: Path,
) -> None:
    """Each broker's mounted certificate is from the mounted CA, names the broker id (what
    neighbours check), its service name and the loopback address (what brokers and the host
    dial), and certifies the broker's manifest key; the CA's key is mounted nowhere; the
    host's client certificate is a client's from the same CA."""
    gen = load_compose_gen()
    gen.write_keys(tmp_path)
    configs = compose_configs(tmp_path)
    ca_cert = x509.load_pem_x509_certificate((tmp_path / "ca" / "ca.crt").read_bytes())
    for config in configs:
        assert config.tls
        assert config.tls_client_cert == "required"
        assert config.tls_ca is not None
        assert config.tls_cert is not None
        assert config.tls_key is not None
        assert config.tls_ca.read_bytes() == (tmp_path / "ca" / "ca.crt").read_bytes()
        cert = x509.load_pem_x509_certificate(config.tls_cert.read_bytes())
        assert verify_issued(ca_cert, cert)
        assert identity_of(cert) == Identity("broker", config.id)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = {str(n.value) for n in sans}
        assert {gen.service(config.id), "localhost", "127.0.0.1"} <= names
        assert config.key_file is not None
        manifest_key = load_private_key(config.key_file).public_key()
        assert cert.public_key() == manifest_key
        assert load_private_key(config.tls_key).public_key() == manifest_key
    compose = (ROOT / "docker-compose.yml").read_text()
    mounted = {p for ms in compose_mounts(compose, tmp_path).values() for p in ms.values()}
    assert not any(p.is_relative_to(tmp_path / "ca") for p in mounted), "the CA key stays home"
    client = x509.load_pem_x509_certificate((tmp_path / "tls" / "client.crt").read_bytes())
    assert verify_issued(ca_cert, client)
    assert identity_of(client) == Identity("client", "client")
    client_key = load_private_key(tmp_path / "tls" / "client.key")
    assert client.public_key() == client_key.public_key()


def test_compose_keys_make_a_manifest_of_every_broker(tmp_path: Path) -> None:
    gen = load_compose_gen()
    manifest = gen.write_keys(tmp_path)
    doc = json.loads(manifest.read_text())
    brokers = {tomllib.loads(p.read_text())["id"] for p in ROOT.glob("deploy/compose/*.toml")}
    assert set(doc["keys"]) == brokers
    assert {b for ids in doc["members"].values() for b in ids} == brokers
    first = (tmp_path / "b0.0.key").read_text()
    cert = (tmp_path / "tls" / "b0.0.crt").read_bytes()
    gen.write_keys(tmp_path)  # kept unless forced
    assert (tmp_path / "b0.0.key").read_text() == first
    assert (tmp_path / "tls" / "b0.0.crt").read_bytes() == cert
    gen.write_keys(tmp_path, force=True)
    assert (tmp_path / "b0.0.key").read_text() != first
    new = x509.load_pem_x509_certificate((tmp_path / "tls" / "b0.0.crt").read_bytes())
    assert new.public_key() == load_private_key(tmp_path / "b0.0.key").public_key()


def test_compose_keys_certify_keys_made_before_tls(tmp_path: Path) -> None:
    """Keys from before the overlay spoke TLS are kept and get certificates."""
    gen = load_compose_gen()
    gen.write_keys(tmp_path)
    key = (tmp_path / "b2.1.key").read_text()
    for directory in (tmp_path / "ca", tmp_path / "tls"):
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()
    gen.write_keys(tmp_path)
    assert (tmp_path / "b2.1.key").read_text() == key
    cert = x509.load_pem_x509_certificate((tmp_path / "tls" / "b2.1.crt").read_bytes())
    assert cert.public_key() == load_private_key(tmp_path / "b2.1.key").public_key()
    assert (tmp_path / "tls" / "client.crt").exists()


def exported_series(metrics: str) -> dict[str, set[str] | None]:
    """Series names a /metrics page exports (from its TYPE lines, so a family with no sample
    yet counts), each with the label names its samples carry (None: no sample yet, so its
    labels are unknown)."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", "")}
    series: dict[str, set[str] | None] = {}
    for match in re.finditer(r"^# TYPE (\S+) (\S+)$", metrics, re.M):
        name, kind = match.groups()
        for suffix in suffixes.get(kind, ("",)):
            series[name + suffix] = None
    for match in re.finditer(r"^([a-zA-Z_:][\w:]*)\{([^}]*)\}", metrics, re.M):
        name, labels = match.groups()
        series[name] = (series.get(name) or set()) | set(re.findall(r'(\w+)="', labels))
    return series


def dashboard_queries(doc: Any) -> Iterator[str]:
    """Every PromQL text in a dashboard: panel targets and templating variables."""
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in doc["templating"]["list"]:
        query = variable["query"]
        yield query["query"] if isinstance(query, dict) else query


def metrics_and_labels(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and label names a PromQL expression uses."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values and strings
    labels: set[str] = set()
    for group in re.findall(r"\{([^}]*)\}", expr):
        labels.update(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", group))
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels.update(re.findall(r"[a-zA-Z_]\w*", group))
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    names = set(re.findall(r"[a-zA-Z_:][\w:]*(?!\w)(?!\s*\()", expr))
    # label_values(metric, label): its second argument is a label.
    for label in re.findall(r"label_values\([^,]*,\s*(\w+)\s*\)", expr):
        names.discard(label)
        labels.add(label)
    return names - PROMQL_WORDS, labels


def test_metrics_and_labels_reads_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, broker) (rate(trellis_x_bucket{type="a b",'
        ' vn=~"$vn"}[1m]))) / on(broker) trellis_y'
    )
    names = {"trellis_x_bucket", "trellis_y"}
    assert metrics_and_labels(expr) == (names, {"le", "broker", "type", "vn"})
    assert metrics_and_labels('label_values(trellis_z{vn=~"$vn"}, broker)') == (
        {"trellis_z"},
        {"vn", "broker"},
    )


def test_dashboard_queries_only_metrics_and_labels_a_broker_exports(
    run_broker: Callable[..., BrokerProcess],
) -> None:
    broker = run_broker("b1", admin_port=0)
    series = exported_series(fetch_text(broker.admin_url + "/metrics"))
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert doc["panels"], "a dashboard with no panel"
    used: set[str] = set()
    checked = 0
    for expr in dashboard_queries(doc):
        names, labels = metrics_and_labels(expr)
        assert names, f"no metric in {expr!r}"
        unknown = names - set(series)
        assert not unknown, f"{expr!r} asks for {unknown}, which no broker exports"
        known = [series[n] for n in names]
        if all(k is not None for k in known):  # labels of families with samples only
            exported = set().union(*known) | SCRAPE_LABELS | {"le"}
            assert labels <= exported, f"{expr!r} uses labels {labels - exported}"
            checked += 1
        used |= names
    assert checked >= 10, "too few queries had their labels checked"
    # Every exported family appears on the dashboard (a histogram through its buckets).
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    missing = {n for n in series if n not in used and n not in families}
    assert not missing, f"metrics exported but on no panel: {sorted(missing)}"
