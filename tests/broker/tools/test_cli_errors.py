"""Errors a person can act on: one line naming the cause and the fix, the right exit code,
no traceback; and what `sub`, `down`, `topology` and `reconfig` say about the state."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.client import Delivery
from broker.tools import cli
from broker.tools.launcher import BrokerProcess, LaunchError
from broker.tools.local import LocalOverlay, is_broker_process, start_overlay
from overlay.tree import line_tree
from tests.support import trellis


def error_line(out: subprocess.CompletedProcess[str], command: str) -> str:
    """The one error line of a failed command (argparse puts its usage above it)."""
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith(f"trellis {command}:")]
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_broker_on_a_port_in_use_names_the_port_and_the_fix() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = trellis("broker", "--port", str(port), timeout=30)
    assert out.returncode == 2
    line = error_line(out, "broker")
    assert f"127.0.0.1:{port}" in line
    assert "already in use" in line
    assert "--port" in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--topology", "bogus"], "--topology 'bogus': not line, star or random, and no such file"),
        (["--vns", "0"], "argument --vns/--brokers: must be greater than 0"),
        (["--vns", "2", "--byzantine", "b9=corrupt"], "no broker b9 in this overlay"),
        (["--vns", "2", "--byzantine", "b1=evil"], "no mode 'evil'; choose drop, corrupt"),
        (["--vns", "2", "--replicas", "3,x"], "--replicas needs 1 or 2 positive counts"),
        (["--vnss", "3"], "unrecognized arguments: --vnss 3"),
    ],
)
def test_up_refuses_bad_arguments_before_starting_anything(
    tmp_path: Path, args: list[str], says: str
) -> None:
    out = trellis("up", *args, "--dir", str(tmp_path / "ov"))
    assert out.returncode == 2
    assert says in error_line(out, "up")
    assert not (tmp_path / "ov" / "overlay.json").exists()


def test_a_typo_in_a_flag_shows_that_subcommands_usage() -> None:
    out = trellis("sub", "--endpoint", "127.0.0.1:9", "*", "--cuont", "3")
    assert out.returncode == 2
    assert out.stderr.startswith("usage: trellis sub ")
    assert "unrecognized arguments: --cuont 3" in error_line(out, "sub")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "give --endpoint HOST:PORT, or --dir DIR --vn VN"),
        (["--dir", "{ov}"], "--dir needs --vn, one of the overlay's VNs: b0, b1"),
        (["--dir", "{ov}", "--vn", "b9"], "has no VN 'b9'; its VNs: b0, b1"),
        (["--vn", "b0", "--endpoint", "127.0.0.1:9"], "give --dir DIR too"),
        (["--dir", "{ov}", "--vn", "b0", "--endpoint", "127.0.0.1:9"], "not both"),
        (["--dir", "{nowhere}", "--vn", "b0"], "missing overlay.json"),
    ],
)
def test_pub_and_sub_say_which_vn_of_a_local_overlay_to_give(
    tmp_path: Path, args: list[str], says: str
) -> None:
    ov = tmp_path / "ov"
    ov.mkdir()
    vns = {f"b{v}": [f"b{v}.{r}" for r in range(3)] for v in range(2)}
    brokers = [{"id": b, "endpoint": "127.0.0.1:9"} for members in vns.values() for b in members]
    (ov / "overlay.json").write_text(json.dumps({"brokers": brokers, "vns": vns}))
    args = [a.format(ov=ov, nowhere=tmp_path / "nowhere") for a in args]
    for command in (["pub", "--attrs", "class='x'", *args], ["sub", "*", *args]):
        out = trellis(*command)
        assert out.returncode == 2
        assert says in error_line(out, command[0])


def test_pub_refuses_empty_attributes(broker: BrokerProcess) -> None:
    out = trellis("pub", "--endpoint", broker.endpoint, "--attrs", "")
    assert out.returncode == 2
    assert "--attrs is empty" in error_line(out, "pub")


def test_version_and_help_describe_the_commands() -> None:
    out = trellis("--version")
    assert out.returncode == 0
    assert out.stdout.startswith("trellis ")
    shown = trellis("--help").stdout
    assert "a local broker with live traffic" not in shown
    assert "live reconfiguration" in shown
    up_help = trellis("up", "--help").stdout
    assert "--log-level" in up_help
    assert "(default: 5)" in up_help


def test_up_refuses_a_directory_whose_overlay_is_running(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(line_tree(["b0"]))
    out = trellis("up", "--vns", "1", "--dir", str(overlay.workdir))
    assert out.returncode == 2
    line = error_line(out, "up")
    assert "already running" in line
    assert f"trellis down --dir {overlay.workdir}" in line
    assert json.loads((overlay.workdir / "overlay.json").read_text())["brokers"][0]["pid"] == (
        overlay.brokers["b0"].pid
    )
    assert overlay.brokers["b0"].alive()


def test_reconfig_says_it_is_off_and_topology_says_a_stopped_overlay_is_not_running(
    run_overlay: Callable[..., LocalOverlay],
) -> None:
    overlay = run_overlay(line_tree(["b0", "b1"]))
    out = trellis("reconfig", "--dir", str(overlay.workdir))
    assert out.returncode == 1
    assert "reconfiguration is off" in error_line(out, "reconfig")
    overlay.stop()
    out = trellis("topology", "--dir", str(overlay.workdir))
    assert out.returncode == 1
    assert "is not running" in error_line(out, "topology")
    out = trellis("down", "--dir", str(overlay.workdir))
    assert out.returncode == 0
    assert out.stdout.startswith("nothing to stop")


def test_sub_says_when_it_is_subscribed_and_quiet_prints_the_count(
    broker: BrokerProcess,
) -> None:
    out = trellis(
        "sub", "--endpoint", broker.endpoint, "class = 'x'", "--quiet", "--timeout", "0.5"
    )
    assert out.returncode == 0, out.stderr
    assert "subscribed to class = 'x'" in out.stderr
    assert out.stdout == "0\n"


def test_plain_delivery_lines_are_not_python_reprs() -> None:
    msg = Delivery({"class": "x", "price": 5, "ok": True, "q": "it's"}, b"hello", "p", 3, "s1")
    assert cli.delivery_line(msg) == "p#3 class='x',price=5,ok=true,q='it\\'s' hello"
    binary = Delivery({"class": "x"}, b"\xff\x00", "p", 4, "s1")
    assert cli.delivery_line(binary) == "p#4 class='x' <2 bytes, base64 /wA=>"


def test_an_error_during_up_stops_the_brokers_it_started(tmp_path: Path) -> None:
    workdir = tmp_path / "ov"
    with pytest.raises(LaunchError, match=r"broker b1 exited with 2 while starting: .*max_frame"):
        start_overlay(
            workdir, line_tree(["b0", "b1", "b2"]), overrides={"b1": {"max_frame": "bogus"}}
        )
    info = json.loads((workdir / "overlay.json").read_text())
    assert [b["id"] for b in info["brokers"]] == ["b0"]
    assert info["starting"] == []
    assert not is_broker_process(info["brokers"][0]["pid"], "b0")
    out = trellis("down", "--dir", str(workdir))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("nothing to stop")


def test_sub_without_a_manifest_explains_once_how_to_decrypt(
    run_overlay: Callable[..., LocalOverlay], tmp_path: Path
) -> None:
    overlay = run_overlay(line_tree(["b0"]))
    ready = tmp_path / "sub.ready"
    endpoint = overlay.endpoint("b0")
    sub = subprocess.Popen(
        [
            *(sys.executable, "-m", "broker", "sub", "--endpoint", endpoint, "class = 'x'"),
            *("--count", "1", "--timeout", "20", "--ready-file", str(ready)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline and sub.poll() is None:
            time.sleep(0.05)
        secret = trellis(
            "pub", "--endpoint", endpoint, "--attrs", "class='x'", "--count", "3", "--confidential"
        )
        assert secret.returncode == 0, secret.stderr
        plain = trellis(
            "pub", "--endpoint", endpoint, "--attrs", "class='x',n=1", "--payload", "hi"
        )
        assert plain.returncode == 0, plain.stderr
        stdout, stderr = sub.communicate(timeout=30)
    finally:
        sub.kill()
        sub.wait(10)
    assert stdout.endswith(" class='x',n=1 hi\n")
    assert stderr.count("--manifest DIR/manifest.json") == 1, stderr
    assert "WARNING" not in stderr


def test_up_into_a_path_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    taken = tmp_path / "file"
    taken.write_text("")
    out = trellis("up", "--vns", "1", "--dir", str(taken))
    assert out.returncode == 2
    assert f"File exists: {taken}" in error_line(out, "up")


def test_a_pid_of_another_program_is_not_taken_for_a_broker(broker: BrokerProcess) -> None:
    import os

    assert is_broker_process(broker.pid, "b1")
    assert not is_broker_process(broker.pid, "b2")
    assert not is_broker_process(os.getpid(), "b1")
