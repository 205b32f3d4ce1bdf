"""The files a broker config names: relative to the config file, checked when it loads, and
every error about one naming the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.daemon.config import ConfigError, config_paths, load_config
from overlay.manifest import Manifest
from overlay.tree import Tree
from security.ca import create_ca, issue, write_issued
from security.envelope import generate_signing_key, private_key_to_bytes, public_key_to_bytes


def write_identity(directory: Path, broker_id: str = "b1") -> tuple[Path, Path]:
    """A broker's key file and a manifest of one VN naming its public key."""
    directory.mkdir(parents=True, exist_ok=True)
    key = generate_signing_key()
    key_file = directory / f"{broker_id}.key"
    key_file.write_text(private_key_to_bytes(key).hex() + "\n", encoding="utf-8")
    manifest = directory / "manifest.json"
    members = {broker_id: (broker_id,)}
    Manifest(Tree([broker_id]), members, {broker_id: public_key_to_bytes(key.public_key())}).save(
        manifest
    )
    return key_file, manifest


def test_relative_paths_in_a_config_file_are_relative_to_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    write_identity(conf / "keys")
    ca = create_ca()
    write_issued(issue(ca, "b1", "broker"), ca, conf / "tls", "b1")
    (conf / "run").mkdir()
    (conf / "trusted.json").write_text("{}")
    path = conf / "broker.toml"
    path.write_text(
        "id = 'b1'\nkey_file = 'keys/b1.key'\nmanifest = 'keys/manifest.json'\n"
        "tls_cert = 'tls/b1.crt'\ntls_key = 'tls/b1.key'\ntls_ca = 'tls/ca.crt'\n"
        "ready_file = 'run/b1.ready'\nlinks_file = 'run/b1.links.json'\n"
        "topic_trust = 'trusted.json'\ncollude_log = 'run/shares.jsonl'\n"
        "[traffic_log]\ndir = 'logs'\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(Path("..") / "conf" / "broker.toml", environ={})
    base = elsewhere / ".." / "conf"  # where the file is, as the broker was told
    assert config_paths(config) == {
        "ready_file": base / "run/b1.ready",
        "links_file": base / "run/b1.links.json",
        "traffic_log.dir": base / "logs",
        "manifest": base / "keys/manifest.json",
        "key_file": base / "keys/b1.key",
        "topic_trust": base / "trusted.json",
        "collude_log": base / "run/shares.jsonl",
        "tls_cert": base / "tls/b1.crt",
        "tls_key": base / "tls/b1.key",
        "tls_ca": base / "tls/ca.crt",
    }


def test_relative_paths_from_the_environment_and_command_line_are_the_working_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_identity(tmp_path)
    path = tmp_path / "conf" / "broker.toml"
    path.parent.mkdir()
    path.write_text("id = 'b1'\n")
    monkeypatch.chdir(tmp_path)
    config = load_config(path, {"ready_file": "b1.ready"}, environ={"TRELLIS_KEY_FILE": "b1.key"})
    assert (config.ready_file, config.key_file) == (Path("b1.ready"), Path("b1.key"))


def test_a_missing_file_is_reported_at_its_resolved_path(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "broker.toml"
    path.parent.mkdir()
    path.write_text("key_file = 'b1.key'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert f"key_file ({path}): Path does not point to a file: {path.parent / 'b1.key'}" in (
        info.value.message
    )


@pytest.mark.parametrize(
    ("key", "text", "why"),
    [
        ("manifest", "{not json", "not a valid overlay manifest (Expecting property name"),
        ("manifest", '{"tree": {}}', "not a valid overlay manifest (malformed manifest"),
        ("key_file", "zz\n", "not an Ed25519 private key (64 hex digits) (non-hexadecimal"),
        ("key_file", "abcd\n", "not an Ed25519 private key (64 hex digits)"),
        ("topic_trust", "{not json", "not a trusted TDNs file (cannot read the trusted TDNs"),
        ("topic_trust", '{"tdn": "abc"}', "not a trusted TDNs file (cannot read the trusted"),
    ],
)
def test_a_file_that_is_not_what_its_key_needs_names_the_key_and_the_file(
    tmp_path: Path, key: str, text: str, why: str
) -> None:
    bad = tmp_path / "bad"
    bad.write_text(text)
    path = tmp_path / "broker.toml"
    path.write_text(f"{key} = 'bad'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert f"{key} ({path}): {bad}: {why}" in info.value.message
    assert "\n" not in info.value.message


def test_a_readable_key_and_manifest_load(tmp_path: Path) -> None:
    key_file, manifest = write_identity(tmp_path)
    config = load_config(None, {"key_file": key_file, "manifest": manifest}, environ={})
    assert (config.key_file, config.manifest) == (key_file, manifest)


def test_a_ready_file_in_a_missing_directory_names_the_key_and_the_directory(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("ready_file = 'run/b1.ready'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert f"ready_file ({path}): " in info.value.message
    assert f"its directory {tmp_path / 'run'} does not exist" in info.value.message


@pytest.mark.parametrize("name", ["broker.yaml", "broker.yml"])
def test_a_yaml_config_loads_like_the_same_toml(tmp_path: Path, name: str) -> None:
    key_file, manifest = write_identity(tmp_path / "keys")
    yaml_path = tmp_path / name
    yaml_path.write_text(
        "broker:\n"
        "  id: b1\n"
        "  port: 7701\n"
        "  key_file: keys/b1.key\n"
        "  manifest: keys/manifest.json\n"
        "  neighbours:\n"
        "    - {id: b2, endpoint: '127.0.0.1:7702'}\n"
        "  reconfig: {enabled: true, interval: 2.5}\n"
    )
    toml_path = tmp_path / "broker.toml"
    toml_path.write_text(
        "[broker]\n"
        "id = 'b1'\n"
        "port = 7701\n"
        "key_file = 'keys/b1.key'\n"
        "manifest = 'keys/manifest.json'\n"
        "neighbours = [{id = 'b2', endpoint = '127.0.0.1:7702'}]\n"
        "reconfig = {enabled = true, interval = 2.5}\n"
    )
    from_yaml = load_config(yaml_path, environ={})
    assert from_yaml == load_config(toml_path, environ={})
    assert from_yaml.key_file == key_file
    assert from_yaml.manifest == manifest


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("port: [7701\n", "not valid YAML"),
        ("- port: 7701\n", "must be a mapping"),
        ("port: seven\n", "port"),
        ("prot: 7701\n", "prot"),
    ],
    ids=["syntax", "not-a-mapping", "bad-value", "unknown-key"],
)
def test_a_bad_yaml_config_is_refused_naming_the_file_and_the_problem(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "broker.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert str(path) in info.value.message
    assert problem in info.value.message
