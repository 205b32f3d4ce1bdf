"""Start the peer brokers the benchmarks compare Trellis against.

Each peer runs as its own process on a free loopback port with a config file written into a
scratch directory, and is stopped by PID. The system Mosquitto on 1883 and NATS on 4222 are
never touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from broker.tools.launcher import stop_process

__all__ = [
    "PeerError",
    "PeerProcess",
    "cpu_seconds",
    "free_port",
    "start_amqtt",
    "start_mosquitto",
    "start_nats",
    "wait_listening",
]

_CLK_TCK = os.sysconf("SC_CLK_TCK")


class PeerError(RuntimeError):
    """A peer broker did not come up."""


@dataclass
class PeerProcess:
    """A running peer broker and where to reach it."""

    name: str
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM, then SIGKILL if the peer overruns `timeout`; returns the exit code."""
        return stop_process(self.process, timeout)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may contain spaces; the fixed fields start after its ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / _CLK_TCK


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the caller races other processes for it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_listening(
    host: str, port: int, process: subprocess.Popen[bytes], timeout: float, log_path: Path
) -> None:
    """Return once `port` accepts TCP connections; raise if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise PeerError(f"{process.args!r} exited with {process.returncode}:\n{tail}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    process.kill()
    process.wait(5)
    raise PeerError(f"{process.args!r} did not listen on {host}:{port} within {timeout:g} s")


def _start(
    name: str, cmd: list[str], workdir: Path, *, host: str, port: int, timeout: float
) -> PeerProcess:
    log_path = workdir / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            start_new_session=True,
        )
    try:
        wait_listening(host, port, process, timeout, log_path)
    except BaseException:
        if process.poll() is None:
            process.kill()
            process.wait(5)
        raise
    return PeerProcess(name, host, port, process, log_path)


def start_mosquitto(
    workdir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    timeout: float = 10.0,
    extra: str = "",
) -> PeerProcess:
    """Start a private Mosquitto with its default limits, anonymous access, on `host`:`port`;
    ``extra`` is appended to its config (a bridge, say)."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    config = workdir / f"mosquitto-{port}.conf"
    config.write_text(f"listener {port} {host}\nallow_anonymous true\n{extra}", encoding="utf-8")
    return _start(
        "mosquitto", [binary, "-c", str(config)], workdir, host=host, port=port, timeout=timeout
    )


def start_amqtt(
    workdir: Path, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 20.0
) -> PeerProcess:
    """Start amqtt's own broker script with anonymous access and no packet/event loggers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    config = workdir / f"amqtt-{port}.yaml"
    config.write_text(
        "listeners:\n"
        "  default:\n"
        "    type: tcp\n"
        f"    bind: {host}:{port}\n"
        "plugins:\n"
        "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
        "    allow_anonymous: true\n",
        encoding="utf-8",
    )
    cmd = [sys.executable, "-m", "amqtt.scripts.broker_script", "-c", str(config)]
    return _start("amqtt", cmd, workdir, host=host, port=port, timeout=timeout)


def start_nats(
    workdir: Path, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 10.0
) -> PeerProcess:
    """Start a private nats-server (core NATS: no JetStream, no monitoring port, no cluster)
    with its default limits on `host`:`port`."""
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    workdir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    config = workdir / f"nats-{port}.conf"
    config.write_text(f'listen: "{host}:{port}"\n', encoding="utf-8")
    return _start(
        "nats", [binary, "-c", str(config)], workdir, host=host, port=port, timeout=timeout
    )


def peer_version(cmd: list[str]) -> str:
    """The first line of a peer's version output that names its version (or "?")."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    text = (out.stdout + out.stderr).strip()
    for line in text.splitlines():
        if "version" in line.lower() or line.startswith("nats-server"):
            return line.strip()
    return text.splitlines()[0] if text else "?"


def wait_until(condition: Callable[[], bool], timeout: float, what: str, poll: float) -> None:
    """Return once ``condition()`` holds; TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(poll)
