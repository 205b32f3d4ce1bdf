"""TLS settings: all three files or none, errors naming the field and the file, and a key
that does not match its certificate refused before the broker listens."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.daemon.config import ConfigError, load_config
from security.ca import create_ca, issue, save_ca, write_issued
from tests.support import trellis


@pytest.fixture
def files(tmp_path: Path) -> Path:
    ca = create_ca()
    save_ca(ca, tmp_path)
    write_issued(issue(ca, "b1", "broker"), ca, tmp_path, "b1")
    write_issued(issue(ca, "b2", "broker"), ca, tmp_path, "b2")
    return tmp_path


def test_tls_needs_certificate_key_and_ca_together(files: Path) -> None:
    path = files / "broker.toml"
    path.write_text(f"tls_cert = '{files / 'b1.crt'}'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "missing tls_key, tls_ca" in info.value.message
    assert str(path) in info.value.message


def test_a_missing_certificate_file_names_the_field_and_the_file(files: Path) -> None:
    path = files / "broker.toml"
    path.write_text(
        f"tls_cert = '{files / 'nope.crt'}'\ntls_key = '{files / 'b1.key'}'\n"
        f"tls_ca = '{files / 'ca.crt'}'\n"
    )
    with pytest.raises(ConfigError, match=r"tls_cert \(.*broker.toml\): Path does not point"):
        load_config(path, environ={})


def test_tls_settings_come_from_the_environment_too(files: Path) -> None:
    config = load_config(
        None,
        environ={
            "TRELLIS_TLS_CERT": str(files / "b1.crt"),
            "TRELLIS_TLS_KEY": str(files / "b1.key"),
            "TRELLIS_TLS_CA": str(files / "ca.crt"),
            "TRELLIS_TLS_CLIENT_CERT": "optional",
        },
    )
    assert config.tls
    assert config.tls_client_cert == "optional"
    assert not load_config(None, environ={}).tls


def test_a_key_that_is_not_the_certificates_stops_the_broker_with_one_line(files: Path) -> None:
    path = files / "broker.toml"
    path.write_text(
        f"port = 0\ntls_cert = '{files / 'b1.crt'}'\ntls_key = '{files / 'b2.key'}'\n"
        f"tls_ca = '{files / 'ca.crt'}'\n"
    )
    result = trellis("broker", "--config", str(path), timeout=30)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("trellis broker: error: invalid TLS settings (tls_ca, tls_cert,")
    assert "b1.crt" in last
    assert "b2.key" in last
