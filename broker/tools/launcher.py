"""Start and stop broker daemons as real processes.

One helper serves the CLI (`trellis demo`, later `trellis up`), the tests and the
benchmarks, so all of them exercise the same daemon a container runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from broker.errors import TrellisError

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop when available (Ctrl-C cancels it, then raises
    KeyboardInterrupt, as ``asyncio.run`` does)."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


class LaunchError(TrellisError):
    """A broker process did not come up."""

    code = "launch"


def stop_process(
    process: subprocess.Popen[Any], timeout: float = 10.0, signalled: bool = False
) -> int:
    """SIGTERM (unless sent already), wait up to ``timeout``, SIGKILL past it; the exit code."""
    if process.poll() is None:
        if not signalled:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    return process.returncode


@dataclass
class BrokerProcess:
    """A running broker daemon and where to reach it."""

    id: str
    host: str
    port: int
    pid: int
    process: subprocess.Popen[bytes]
    workdir: Path
    admin_port: int = 0

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.id}.log"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0, signalled: bool = False) -> int:
        """SIGTERM (unless ``signalled`` already), wait for graceful shutdown, SIGKILL if it
        overruns; returns the exit code. A second SIGTERM would skip the graceful stage."""
        return stop_process(self.process, timeout, signalled)

    def kill(self) -> None:
        """Crash the broker (no graceful shutdown), as a fault-injection test wants."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def write_config(path: Path, settings: dict[str, Any]) -> Path:
    """Write a flat broker config as TOML (and check it reads back)."""
    lines = [
        f"{key} = {_toml_value(value)}" for key, value in settings.items() if value is not None
    ]
    text = "\n".join(lines) + "\n"
    tomllib.loads(text)
    path.write_text(text, encoding="utf-8")
    return path


def without_config_overrides(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables a broker reads as config overrides
    (``TRELLIS_<KEY>``, ``TRELLIS_<TABLE>_<KEY>``); other ``TRELLIS_*`` variables
    (``TRELLIS_PORT_RANGE``, ...) stay."""
    from broker.daemon.config import is_config_override

    return {key: value for key, value in environ.items() if not is_config_override(key)}


def start_broker(
    workdir: Path,
    broker_id: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    settings: dict[str, Any] | None = None,
    ready_timeout: float = 40.0,
    env: dict[str, str] | None = None,
    inherit_config: bool = True,
    on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> BrokerProcess:
    """Start ``trellis broker`` as a child process and wait until it listens.

    The broker reads ``TRELLIS_<KEY>`` config overrides from this process's environment
    unless ``inherit_config`` is false: a caller that writes the whole config (a local
    overlay) keeps an exported ``TRELLIS_PORT`` from moving every broker to one port.
    ``env`` is added on top either way. ``on_spawn`` sees the process as soon as it exists
    (a caller records its pid before the wait). If the wait ends any other way than ready,
    an interrupt included, the process is killed: a broker never outlives a failed start.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / f"{broker_id}.ready"
    ready.unlink(missing_ok=True)
    config = write_config(
        workdir / f"{broker_id}.toml",
        {"id": broker_id, "host": host, "port": port, "ready_file": str(ready), **(settings or {})},
    )
    cmd = [sys.executable, "-m", "broker", "broker", "--config", str(config)]
    inherited = dict(os.environ) if inherit_config else without_config_overrides(os.environ)
    proc: subprocess.Popen[bytes] | None = None
    try:
        # A Ctrl-C or SIGTERM while Popen forks and execs would unwind out of it with the
        # child running and known to nobody (1 interrupted demo in ~25 left a broker
        # behind): it is held until ``proc`` is set, then raised here, and stops it.
        with signals_held(), (workdir / f"{broker_id}.log").open("ab") as log_file:
            proc = subprocess.Popen(
                cmd,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**inherited, **(env or {})},
                start_new_session=True,
            )
        if on_spawn is not None:
            on_spawn(proc)
        return wait_ready(proc, workdir, broker_id, host, ready, ready_timeout)
    except BaseException:
        if proc is not None:
            stop_process(proc, timeout=5.0)
        raise


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block are held and raised again after it, to
    the handlers in force before (unlike ignoring them, which would lose them; and a child
    spawned in the block gets the default dispositions, as exec resets caught signals).
    Only the main thread can change signal handlers; elsewhere, no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        held.append(signum)

    saved = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for signum in held:
            signal.raise_signal(signum)


def wait_ready(
    proc: subprocess.Popen[bytes],
    workdir: Path,
    broker_id: str,
    host: str,
    ready: Path,
    ready_timeout: float,
) -> BrokerProcess:
    """Wait for a spawned broker's ready file (it logs to ``workdir/<id>.log``).

    Raises:
        LaunchError: the broker exited (its last log line says why) or timed out; the
            caller stops the process.
    """
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log_path = workdir / f"{broker_id}.log"
            lines = log_path.read_text(errors="replace").splitlines()
            last = next((line for line in reversed(lines) if line.strip()), "no output")
            raise LaunchError(
                f"broker {broker_id} exited with {proc.returncode} while starting: "
                f"{last.strip()} (its log: {log_path})"
            )
        if ready.exists():
            info = dict(item.split("=", 1) for item in ready.read_text().split())
            return BrokerProcess(
                broker_id,
                host,
                int(info["port"]),
                proc.pid,
                proc,
                workdir,
                int(info.get("admin_port", 0)),
            )
        time.sleep(0.02)
    raise LaunchError(f"broker {broker_id} did not become ready within {ready_timeout:g} s")
