"""`trellis up` and `trellis demo` interrupted (SIGINT, SIGTERM) at several moments: no
process of theirs is left, `trellis down` agrees, and the demo's temp directory is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import trellis, wait_for

pytestmark = pytest.mark.slow


def processes_under(directory: Path) -> list[int]:
    """Pids of live processes whose command line names a path under ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(directory) in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Commands a test starts; any still running afterwards is killed, and any broker left
    under ``tmp_path`` (a failure of the code under test) too, by its pid."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for pid in processes_under(tmp_path):
        os.kill(pid, signal.SIGKILL)


def spawn(
    procs: list[subprocess.Popen[bytes]], tmp_path: Path, *args: str
) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / f"out{len(procs)}.txt"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", *args],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )
    procs.append(proc)
    return proc, out


def brokers_listed(workdir: Path) -> int:
    try:
        info = json.loads((workdir / "overlay.json").read_text())
    except (OSError, ValueError):
        return 0
    return len(info["brokers"]) + len(info["starting"])


@pytest.mark.parametrize(
    ("sig", "moment"),
    [
        (signal.SIGINT, 1),  # the first broker is being launched
        (signal.SIGINT, 5),  # part of the overlay is up, one broker starting
        (signal.SIGTERM, 8),
    ],
)
def test_interrupted_up_leaves_no_broker_and_down_agrees(
    tmp_path: Path, started: list[subprocess.Popen[bytes]], sig: signal.Signals, moment: int
) -> None:
    workdir = tmp_path / "ov"
    up, out = spawn(started, tmp_path, "up", "--vns", "5", "--replicas", "3", "--dir", str(workdir))
    wait_for(lambda: brokers_listed(workdir) >= moment or up.poll() is not None)
    up.send_signal(sig)
    assert up.wait(30) == 128 + sig, out.read_text()
    assert "interrupted; stopped every broker" in out.read_text()
    assert "Traceback" not in out.read_text()
    assert processes_under(workdir) == []
    down = trellis("down", "--dir", str(workdir))
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith("nothing to stop")
    # and the directory is free again
    again = trellis("up", "--vns", "2", "--dir", str(workdir))
    assert again.returncode == 0, again.stderr
    down = trellis("down", "--dir", str(workdir))
    assert down.stdout.startswith("stopped 2 brokers"), down.stdout
    assert processes_under(workdir) == []


@pytest.mark.parametrize(
    ("sig", "after", "count"),
    [
        (signal.SIGINT, "brokers up: b0.0", 2000),  # launching the first overlay
        (signal.SIGINT, "streaming traffic", 20000),  # during traffic (long enough to catch)
        (signal.SIGTERM, "closed loop:", 2000),  # during the analytics job (a Spark subprocess)
    ],
)
def test_interrupted_demo_leaves_no_process_and_removes_its_temp_dir(
    tmp_path: Path,
    started: list[subprocess.Popen[bytes]],
    sig: signal.Signals,
    after: str,
    count: int,
) -> None:
    demo, out = spawn(started, tmp_path, "demo", "--count", str(count))
    wait_for(lambda: after in out.read_text() or demo.poll() is not None)
    demo.send_signal(sig)
    assert demo.wait(60) == 128 + sig, out.read_text()
    text = out.read_text()
    assert "Traceback" not in text
    assert "interrupted; every broker it started is stopped" in text
    workdir = Path(text.split("working directory: ", 1)[1].split(" (", 1)[0])
    assert workdir.parent == tmp_path
    assert f"removed {workdir}" in text
    assert not workdir.exists()
    assert processes_under(tmp_path) == []


def test_interrupted_demo_with_a_dir_keeps_it_and_down_finds_nothing_running(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    workdir = tmp_path / "demo"
    demo, out = spawn(started, tmp_path, "demo", "--count", "20000", "--dir", str(workdir))
    wait_for(lambda: "streaming traffic" in out.read_text() or demo.poll() is not None)
    demo.send_signal(signal.SIGINT)
    assert demo.wait(60) == 130, out.read_text()
    assert processes_under(workdir) == []
    assert (workdir / "demo.log").exists()
    down = trellis("down", "--dir", str(workdir / "line"))
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith("nothing to stop")


def test_down_stops_every_broker_of_an_up_that_was_killed_mid_launch(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """SIGKILL cannot be caught: overlay.json names each broker from the moment it is spawned,
    so `trellis down` still finds them all, the one that was starting included."""
    workdir = tmp_path / "ov"
    up, _ = spawn(started, tmp_path, "up", "--vns", "5", "--replicas", "3", "--dir", str(workdir))
    wait_for(lambda: brokers_listed(workdir) >= 4 or up.poll() is not None)
    up.kill()
    up.wait(10)
    listed = brokers_listed(workdir)
    left = processes_under(workdir)
    assert 0 < len(left) <= listed
    down = trellis("down", "--dir", str(workdir))
    assert down.returncode == 0, down.stderr
    # A broker caught mid-start may still be exiting on its own while `down` runs, so the
    # count it reports is at most what was left; what matters is that nothing remains.
    stopped = re.match(r"stopped (\d+) broker", down.stdout)
    assert stopped is not None, down.stdout
    assert 0 < int(stopped.group(1)) <= len(left), down.stdout
    wait_for(lambda: processes_under(workdir) == [], timeout=15)


def test_a_second_up_into_a_directory_being_started_is_refused(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    workdir = tmp_path / "ov"
    first, out = spawn(
        started, tmp_path, "up", "--vns", "4", "--replicas", "3", "--dir", str(workdir)
    )
    wait_for(lambda: brokers_listed(workdir) >= 1 or first.poll() is not None)
    second = trellis("up", "--vns", "2", "--dir", str(workdir))
    assert second.returncode == 2
    assert "Traceback" not in second.stderr
    # "another trellis up is starting", or "already running" if the first one finished
    assert f"trellis down --dir {workdir}" in second.stderr
    assert first.wait(60) == 0, out.read_text()
    down = trellis("down", "--dir", str(workdir))
    assert down.stdout.startswith("stopped 12 brokers"), down.stdout
    assert processes_under(workdir) == []
