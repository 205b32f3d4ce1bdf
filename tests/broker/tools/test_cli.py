"""The `trellis` command line, run as real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.tools import cli
from broker.tools.launcher import BrokerProcess
from tests.support import trellis


def test_pub_and_sub_exchange_json_lines(broker: BrokerProcess, tmp_path: Path) -> None:
    ready = tmp_path / "sub.ready"
    sub = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker",
            "sub",
            "--endpoint",
            broker.endpoint,
            "class = 'x' and price < 10",
            "--count",
            "3",
            "--json",
            "--timeout",
            "30",
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), sub.stderr.read() if sub.poll() is not None else "not ready"
        out = trellis(
            "pub",
            "--endpoint",
            broker.endpoint,
            "--attrs",
            "class='x',price=50",
            "--count",
            "2",
            "--client-id",
            "cli-pub",
            "--advertise",
            "class = 'x'",
        )
        assert out.returncode == 0, out.stderr
        out = trellis(
            "pub",
            "--endpoint",
            broker.endpoint,
            "--attrs",
            "class='x',price=5",
            "--payload",
            "hello",
            "--count",
            "3",
            "--client-id",
            "cli-pub2",
            "--first-seq",
            "1",
        )
        assert out.returncode == 0, out.stderr
        stdout, stderr = sub.communicate(timeout=30)
    finally:
        sub.kill()
    assert sub.returncode == 0, stderr
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert lines == [
        {"attrs": {"class": "x", "price": 5}, "payload": "hello", "publisher": "cli-pub2", "seq": s}
        for s in (1, 2, 3)
    ]


def test_cli_reports_a_filter_syntax_error_with_its_position(broker: BrokerProcess) -> None:
    out = trellis("sub", "--endpoint", broker.endpoint, "class = 'x' or price < 3", "--count", "1")
    assert out.returncode == 2
    assert "'or' at position 12" in out.stderr


def test_broker_refuses_a_config_with_a_typo(tmp_path: Path) -> None:
    config = tmp_path / "b.toml"
    config.write_text("id = 'b'\nport = 0\nmax_fram = 10\n")
    out = trellis("broker", "--config", str(config), timeout=30)
    assert out.returncode == 2
    assert "max_fram" in out.stderr
    assert str(config) in out.stderr


def test_up_topology_down_manage_a_local_overlay(tmp_path: Path) -> None:
    workdir = tmp_path / "ov"
    out = trellis(
        "up", "--brokers", "3", "--topology", "star", "--log-level", "debug", "--dir", str(workdir)
    )
    assert out.returncode == 0, out.stderr
    try:
        assert 'log_level = "debug"' in (workdir / "b1.toml").read_text()
        info = json.loads((workdir / "overlay.json").read_text())
        assert [b["id"] for b in info["brokers"]] == ["b0", "b1", "b2"]
        assert info["links"] == [["b0", "b1"], ["b0", "b2"]]
        shown = trellis("topology", "--dir", str(workdir), "--json")
        assert shown.returncode == 0, shown.stderr
        health = {b["id"]: b["health"] for b in json.loads(shown.stdout)["brokers"]}
        assert health["b0"]["links"] == ["b1", "b2"]
        assert health["b1"]["links"] == ["b0"]
    finally:
        down = trellis("down", "--dir", str(workdir))
    assert down.returncode == 0, down.stderr
    assert "stopped 3 brokers" in down.stdout


def test_pst_generate_then_solve_prints_a_proven_tree(tmp_path: Path) -> None:
    out = trellis("pst", "generate", "--set", "A", "--seed", "5", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    problems = sorted(tmp_path.glob("*.json"))
    assert problems
    solved = trellis("pst", "solve", str(problems[-1]), "--solver", "exact")
    assert solved.returncode in (0, 1), solved.stderr
    result = json.loads(solved.stdout)
    assert result["solver"] == "exact"
    assert result["proven_optimal"] is True
    if result["feasible"]:
        assert result["tree"]["root"] == json.loads(problems[-1].read_text())["publisher"]


def test_sub_reports_an_unreadable_manifest_without_a_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    out = trellis("sub", "--endpoint", "127.0.0.1:9", "*", "--manifest", str(missing))
    assert out.returncode == 2
    assert "trellis sub: error: cannot read the manifest" in out.stderr
    assert "Traceback" not in out.stderr


def test_broker_command_loads_neither_the_sdk_nor_the_solvers() -> None:
    probe = (
        "import sys\n"
        "from broker.tools.cli import build_parser\n"
        "build_parser().parse_args(['broker', '--port', '0'])\n"
        "heavy = ('networkx', 'reconfig.mtpsto', 'broker.client', 'broker.tools.local',"
        " 'broker.tools.demo', 'cryptography')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_pst_help_is_the_solvers_own_and_the_command_list_names_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from reconfig.mtpsto.cli import SOLVERS

    with pytest.raises(SystemExit) as done:
        cli.main(["pst", "solve", "--help"])
    assert done.value.code == 0
    solve_help = capsys.readouterr().out
    assert "usage: trellis pst solve" in solve_help
    assert "{" + ",".join(SOLVERS) + "}" in solve_help
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "most trusted publish/subscribe trees" in capsys.readouterr().out
