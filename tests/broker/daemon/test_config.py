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


NEIGHBOUR = '[{"id": "b2", "endpoint": "127.0.0.1:41999", "vn": "b2", "replica": 0}]'


def test_list_and_table_keys_read_json_from_the_environment() -> None:
    config = load_config(
        None,
        environ={
            "TRELLIS_NEIGHBOURS": NEIGHBOUR,
            "TRELLIS_PEERS": '[{"id": "b3", "endpoint": "127.0.0.1:41998"}]',
            "TRELLIS_RECONFIG": '{"enabled": true, "interval": 4}',
        },
    )
    assert [(n.id, n.endpoint, n.vn_id) for n in config.neighbours] == [
        ("b2", "127.0.0.1:41999", "b2")
    ]
    assert [n.id for n in config.peers] == ["b3"]
    assert (config.reconfig.enabled, config.reconfig.interval) == (True, 4.0)


def test_one_key_of_a_table_from_the_environment_applies_over_the_table_it_overrides(
    tmp_path: Path,
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        "[reconfig]\ninterval = 5.0\njitter = 0.5\n\n[traffic_log]\nrotate_seconds = 60\n"
    )
    over_file = load_config(
        path,
        environ={"TRELLIS_RECONFIG_ENABLED": "true", "TRELLIS_TRAFFIC_LOG_ENABLED": "false"},
    )
    assert (over_file.reconfig.enabled, over_file.reconfig.interval) == (True, 5.0)
    assert (over_file.traffic_log.enabled, over_file.traffic_log.rotate_seconds) == (False, 60.0)
    # TRELLIS_RECONFIG replaces the file's table whole (jitter back to its default)
    over_env = load_config(
        path,
        environ={"TRELLIS_RECONFIG": '{"interval": 7}', "TRELLIS_RECONFIG_ENABLED": "yes"},
    )
    reconfig = over_env.reconfig
    assert (reconfig.enabled, reconfig.interval, reconfig.jitter) == (True, 7.0, 0.25)


def test_traffic_log_from_the_environment_is_a_directory_off_or_a_json_table() -> None:
    assert load_config(None, environ={"TRELLIS_TRAFFIC_LOG": "/logs"}).traffic_log.dir == Path(
        "/logs"
    )
    assert not load_config(None, environ={"TRELLIS_TRAFFIC_LOG": "off"}).traffic_log.enabled
    table = load_config(None, environ={"TRELLIS_TRAFFIC_LOG": '{"flush_interval": 2}'})
    assert table.traffic_log.flush_interval == 2.0


def test_json_that_does_not_parse_names_the_variable() -> None:
    with pytest.raises(
        ConfigError, match=r"neighbours \(environment variable TRELLIS_NEIGHBOURS\)"
    ):
        load_config(None, environ={"TRELLIS_NEIGHBOURS": "[{id: b2}]"})


def test_an_unknown_key_of_a_table_in_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="TRELLIS_RECONFIG_ENABLD: reconfig has no key 'enabld'"):
        load_config(None, environ={"TRELLIS_RECONFIG_ENABLD": "true"})


def test_a_bad_value_for_one_key_of_a_table_names_its_variable() -> None:
    with pytest.raises(
        ConfigError, match=r"reconfig\.interval \(environment variable TRELLIS_RECONFIG_INTERVAL\)"
    ):
        load_config(None, environ={"TRELLIS_RECONFIG_INTERVAL": "-1"})


@pytest.mark.parametrize(("replica", "vn_size"), [(3, 3), (1, 1)])
def test_a_replica_index_outside_its_vn_is_refused(replica: int, vn_size: int) -> None:
    with pytest.raises(ConfigError, match=f"replica = {replica} with vn_size = {vn_size}"):
        load_config(None, {"replica": replica, "vn_size": vn_size}, environ={})


@pytest.mark.parametrize("key", ["neighbours", "peers"])
def test_a_broker_listed_as_its_own_neighbour_or_peer_is_refused(key: str) -> None:
    entry = {"id": "b1", "endpoint": "127.0.0.1:41999"}
    with pytest.raises(ConfigError, match=f"{key} lists 'b1', this broker's own id"):
        load_config(None, {"id": "b1", key: [entry]}, environ={})


def test_a_neighbour_listed_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        "id = 'b1'\n"
        "neighbours = [{id = 'b2', endpoint = '127.0.0.1:41999'},"
        " {id = 'b2', endpoint = '127.0.0.1:41998'}]\n"
    )
    with pytest.raises(ConfigError, match="neighbours lists 'b2' twice"):
        load_config(path, environ={})


def test_a_neighbour_replica_index_outside_its_vn_is_refused() -> None:
    entry = {"id": "b2.3", "endpoint": "127.0.0.1:41999", "vn": "b2", "replica": 3, "vn_size": 3}
    with pytest.raises(ConfigError, match=r"neighbours\.0 .*neighbour 'b2\.3': replica = 3"):
        load_config(None, {"neighbours": [entry]}, environ={})


@pytest.mark.parametrize(
    ("second", "why"),
    [
        ({"replica": 1, "vn_size": 4}, "'b2.0' and 'b2.1' of VN 'b2' disagree on its vn_size"),
        ({"replica": 0, "vn_size": 3}, "'b2.0' and 'b2.1' are both replica 0 of VN 'b2'"),
    ],
)
def test_neighbours_of_one_vn_that_disagree_about_it_are_refused(
    second: dict[str, int], why: str
) -> None:
    first = {"id": "b2.0", "endpoint": "127.0.0.1:41999", "vn": "b2", "replica": 0, "vn_size": 3}
    other = {"id": "b2.1", "endpoint": "127.0.0.1:41998", "vn": "b2", **second}
    with pytest.raises(ConfigError, match=why):
        load_config(None, {"neighbours": [first, other]}, environ={})


@pytest.mark.parametrize("port", ["99999", "65536", "0"])
def test_a_neighbour_port_outside_1_to_65535_is_refused(tmp_path: Path, port: str) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(f"neighbours = [{{id = 'b2', endpoint = '127.0.0.1:{port}'}}]\n")
    with pytest.raises(
        ConfigError, match=rf"neighbours\.0\.endpoint \(.*broker.toml\): .*port {port} is not"
    ):
        load_config(path, environ={})


def test_client_endpoints_come_from_json_and_name_only_replicas_of_this_vn() -> None:
    peers = '[{"id": "b0.1", "endpoint": "b0-1:7700", "vn": "b0", "replica": 1, "vn_size": 2}]'
    base = {"id": "b0.0", "vn": "b0", "vn_size": 2}
    dial = '{"b0.0": "127.0.0.1:7700", "b0.1": "127.0.0.1:7701"}'
    config = load_config(
        None, base, environ={"TRELLIS_PEERS": peers, "TRELLIS_CLIENT_ENDPOINTS": dial}
    )
    assert config.client_endpoints == {"b0.0": "127.0.0.1:7700", "b0.1": "127.0.0.1:7701"}
    with pytest.raises(ConfigError, match=r"names 'b1\.0', which neither neighbours nor peers"):
        load_config(
            None,
            base,
            environ={"TRELLIS_PEERS": peers, "TRELLIS_CLIENT_ENDPOINTS": '{"b1.0": "h:1"}'},
        )
    with pytest.raises(ConfigError, match=r"client_endpoints\.b0\.1 .*port 70000"):
        load_config(None, {**base, "client_endpoints": {"b0.1": "h:70000"}}, environ={})
