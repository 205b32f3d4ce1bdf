"""What a new user's first runs showed: the environment a local overlay's brokers start
with, exit codes and one-line errors that say what was asked and what to type, and
``--help`` and the README's CLI reference telling the truth about every option."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.tools import cli
from broker.tools.launcher import without_config_overrides
from broker.tools.local import LocalOverlay
from overlay.tree import line_tree
from tests.broker.tools.test_cli_errors import error_line
from tests.support import trellis

README = Path(__file__).resolve().parents[3] / "README.md"


def held_port() -> socket.socket:
    """A listening socket on a loopback port, so nothing else can bind it."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


# -- 1. `trellis up` and the TRELLIS_<KEY> variables of its environment ------------------


def test_up_starts_brokers_without_the_exported_broker_config_variables(tmp_path: Path) -> None:
    workdir = tmp_path / "ov"
    with held_port() as holder:
        port = holder.getsockname()[1]
        env = {**os.environ, "TRELLIS_PORT": str(port), "TRELLIS_ID": "from-env"}
        try:
            out = subprocess.run(
                [sys.executable, "-m", "broker", "up", "--vns", "2", "--dir", str(workdir)],
                capture_output=True,
                text=True,
                timeout=90,
                env=env,
                check=False,
            )
            assert out.returncode == 0, out.stderr
            info = json.loads(out.stdout)
            assert [b["id"] for b in info["brokers"]] == ["b0", "b1"]
            assert all(not b["endpoint"].endswith(f":{port}") for b in info["brokers"])
        finally:
            assert trellis("down", "--dir", str(workdir)).returncode == 0


def test_only_broker_config_variables_are_left_out_of_a_brokers_environment() -> None:
    environ = {
        "TRELLIS_PORT": "41777",
        "TRELLIS_TRAFFIC_LOG": "off",
        "TRELLIS_ADMIN_PORT": "9100",
        "TRELLIS_RECONFIG_ENABLED": "true",
        "TRELLIS_TRAFFIC_LOG_DIR": "/logs",
        "TRELLIS_PORT_RANGE": "41000-42999",
        "TRELLIS_KEYS_DIR": "/keys",
        "PATH": "/bin",
    }
    assert without_config_overrides(environ) == {
        "TRELLIS_PORT_RANGE": "41000-42999",
        "TRELLIS_KEYS_DIR": "/keys",
        "PATH": "/bin",
    }


# -- 2. `reconfig --rounds K --timeout S` --------------------------------------------------


def test_reconfig_says_how_many_rounds_ran_when_the_timeout_comes_first(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(line_tree(["b0", "b1"]), reconfig={"enabled": True, "interval": 3600.0})
    out = trellis(
        "reconfig", "--dir", str(overlay.workdir), "--rounds", "5", "--timeout", "1",
        "--every", "0.2",
    )  # fmt: skip
    assert out.returncode == 1
    assert "0 of 5 rounds ran before the timeout" in error_line(out, "reconfig")


# -- 3. `trust show --curve` for a broker the feedback does not judge ----------------------


@pytest.fixture
def analytics_out(tmp_path: Path) -> Path:
    pytest.importorskip("pyarrow")
    from tests.reconfig.test_rebuild_cli import feedback, write_outputs

    rows = [feedback(0.0, "v1.0", "v2.0"), feedback(0.0, "v1.0", "v2.1", missing=10)]
    return write_outputs(tmp_path / "out", rows, [])


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_trust_curve_of_an_unknown_broker_names_the_brokers_that_exist(
    analytics_out: Path, json_flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["trust", "show", "--from", str(analytics_out), "--curve", "nosuch", *json_flag]
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("trellis trust: error: --curve nosuch: no such broker")
    assert "its brokers are v2.0 v2.1" in captured.err


# -- 4. errors as one line `trellis COMMAND: error: ...` ------------------------------------


@pytest.mark.parametrize(
    ("args", "command", "says"),
    [
        (
            ["analytics", "run", "--logs", "/nonexistent", "--out", "OUT"],
            "analytics run",
            "argument --logs: no such log directory: '/nonexistent'",
        ),
        (
            ["analytics", "export", "--logs", "/nonexistent"],
            "analytics export",
            "argument --logs: no such log directory: '/nonexistent'",
        ),
        (
            ["analytics", "run", "--logs", ".", "--out", "OUT", "--window", "abc"],
            "analytics run",
            "argument --window: expected a duration such as 60, 60s, 5m or 1h, got 'abc'",
        ),
        (
            ["analytics", "run", "--logs", ".", "--out", "OUT", "--timely", "0"],
            "analytics run",
            "argument --timely: must be greater than 0, got '0'",
        ),
        (
            ["pst", "solve", "/nonexistent.json"],
            "pst solve",
            "/nonexistent.json: No such file or directory",
        ),
    ],
)
def test_errors_are_one_line_naming_the_command(
    tmp_path: Path, args: list[str], command: str, says: str
) -> None:
    out = trellis(*(str(tmp_path / a) if a == "OUT" else a for a in args))
    assert out.returncode == 2
    line = error_line(out, command)
    assert line == f"trellis {command}: error: {says}"
    assert not (tmp_path / "OUT").exists()


def test_sdk_hints_name_the_cli_options() -> None:
    hint = "closed during handshake (EOF); a broker that speaks TLS only needs ca=, any other"
    assert cli.as_flags(hint).endswith("needs --ca, any other")
    assert cli.as_flags("a client certificate needs the CA too (ca=)") == (
        "a client certificate needs the CA too (--ca)"
    )
    assert cli.as_flags("--attrs key=5 price=x") == "--attrs key=5 price=x"


def test_plaintext_pub_at_a_tls_broker_is_told_to_give_ca(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(line_tree(["b0"]), tls=True)
    out = trellis("pub", "--endpoint", overlay.endpoint("b0"), "--attrs", "class='x'")
    assert out.returncode == 2
    line = error_line(out, "pub")
    assert "speaks TLS only needs --ca" in line
    assert "ca=" not in line


# -- 5. `ca issue` over an existing certificate --------------------------------------------


def test_ca_issue_refuses_to_replace_a_certificate_and_key_unless_forced(tmp_path: Path) -> None:
    ca_dir, out_dir = tmp_path / "ca", tmp_path / "out"
    assert trellis("ca", "init", "--dir", str(ca_dir)).returncode == 0
    issue = ("ca", "issue", "--ca", str(ca_dir), "--name", "b1", "--out", str(out_dir))
    assert trellis(*issue).returncode == 0
    cert, key = (out_dir / "b1.crt").read_bytes(), (out_dir / "b1.key").read_bytes()

    again = trellis(*issue)
    assert again.returncode == 2
    line = error_line(again, "ca")
    assert "already holds b1.crt and b1.key for 'b1'" in line
    assert "--force" in line
    assert (out_dir / "b1.crt").read_bytes() == cert
    assert (out_dir / "b1.key").read_bytes() == key

    forced = trellis(*issue, "--force")
    assert forced.returncode == 0, forced.stderr
    assert (out_dir / "b1.key").read_bytes() != key


# -- 6. a taken admin port -----------------------------------------------------------------


def test_broker_on_a_taken_admin_port_says_admin_port() -> None:
    with held_port() as holder:
        port = holder.getsockname()[1]
        out = trellis("broker", "--port", "0", "--admin-port", str(port), timeout=30)
    assert out.returncode == 2
    line = error_line(out, "broker")
    assert f"127.0.0.1:{port}" in line
    assert "choose another port with --admin-port" in line


# -- 7. numbers that must be positive ------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (
            "pst generate --set A --seed 1 --out OUT --graphs-per-size 0",
            "argument --graphs-per-size: must be greater than 0, got '0'",
        ),
        (
            "pst solve problem.json --time-limit -1",
            "argument --time-limit: must be greater than 0, got '-1'",
        ),
    ],
)
def test_pst_refuses_counts_and_limits_that_are_not_positive(
    tmp_path: Path, command: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main([str(tmp_path / a) if a == "OUT" else a for a in command.split()])
    assert done.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "OUT").exists()


# -- 8. --help and the README --------------------------------------------------------------


def every_option() -> Iterator[tuple[str, argparse.Action]]:
    """(command path, option) for every option of every command, pst's and analytics'
    (each its own parser) included."""
    from analytics.cli import build_parser as analytics_parser

    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}".strip())
            elif not isinstance(action, argparse._HelpAction) and path != "analytics":
                yield path, action

    yield from walk(cli.build_parser(pst=True), "")
    yield from walk(analytics_parser(), "analytics")


def test_every_option_of_every_command_has_help_that_names_its_default() -> None:
    for command, action in every_option():
        assert action.help, f"trellis {command} {action.option_strings}: no help"
        if action.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in action.help, f"trellis {command} {action.dest}: no default"


def test_the_readme_cli_reference_names_every_option() -> None:
    text = README.read_text()
    reference = text[text.index("## CLI reference") : text.index("\n## ", text.index("## CLI"))]
    rows = [line for line in reference.splitlines() if line.startswith("| `trellis ")]
    shared = reference.split("\n\n")[2]  # "`pub` and `sub` also take ..."
    for command, action in every_option():
        if not command or not action.option_strings:
            continue
        row = " ".join(r for r in rows if re.match(rf"\| `trellis {command}[ `]", r))
        assert row, f"README: no row for trellis {command}"
        if command in ("pub", "sub"):
            row += shared
        for option in action.option_strings:
            assert re.search(rf"{re.escape(option)}(?![\w-])", row), f"{command} {option}"


def test_up_help_lists_every_byzantine_mode_the_brokers_accept() -> None:
    from broker.daemon.config import BYZANTINE_MODES

    shown = " ".join(trellis("up", "--help").stdout.split())
    assert ", ".join(BYZANTINE_MODES) in shown


def test_analytics_help_lists_its_commands() -> None:
    out = trellis("analytics", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: trellis analytics ")
    commands = re.findall(r"^    (\w+) ", out.stdout, re.MULTILINE)
    assert commands == ["run", "export"]
