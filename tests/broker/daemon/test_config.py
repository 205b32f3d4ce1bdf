"""Broker configuration: strict validation that names the field and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.daemon.config import ConfigError, load_config


def test_defaults_validate() -> None:
    config = load_config(None, environ={})
    assert config.port == 7700
    assert config.max_frame == 1024 * 1024


def test_typo_in_file_is_an_error_naming_key_and_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("id = 'b1'\nprot = 7000\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "prot" in info.value.message
    assert str(path) in info.value.message


def test_bad_value_names_field_and_its_source(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("port = 70000\n")
    with pytest.raises(ConfigError, match=r"port \(.*broker.toml\)"):
        load_config(path, environ={})


def test_environment_overrides_file_and_command_line_overrides_environment(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("[broker]\nid = 'from-file'\nport = 7001\n")
    config = load_config(path, environ={"TRELLIS_PORT": "7002", "TRELLIS_ID": "from-env"})
    assert (config.id, config.port) == ("from-env", 7002)
    config = load_config(path, {"port": 7003}, environ={"TRELLIS_PORT": "7002"})
    assert config.port == 7003


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TRELLIS_MAX_FRAME"):
        load_config(None, environ={"TRELLIS_MAX_FRAME": "lots"})


def test_unparsable_toml_is_reported_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("port = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(path, environ={})


def test_missing_file_is_reported() -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config("/nonexistent/trellis.toml", environ={})
