"""Footprint benchmark: what a Trellis broker daemon costs to start and to keep idle.

Usage::

    .venv/bin/python bench/bench_footprint.py                 # 5 cheap runs, 3 overlay runs
    .venv/bin/python bench/bench_footprint.py --quick         # 1 run each, a 10-broker overlay
    .venv/bin/python bench/bench_footprint.py --parts a,b     # skip the 40-broker overlay
    .venv/bin/python bench/bench_footprint.py --write --label "after X"   # append to RESULTS

It drives the daemon only as an operator would: ``python -m broker broker --config FILE`` and
the ``trellis`` command line (``up``, ``topology``, ``down``) run as ``python -m broker ...``
(or the console script given with ``--trellis``). It never imports Trellis itself, so it keeps
working however the ``broker`` package is laid out inside. It measures, as medians:

(a) import cost: ``python -X importtime -m broker broker --config CFG`` (the daemon's whole
    start, so lazy imports on the way to "listening" count too) is parsed: the total of the
    top-level entries, the same for a bare ``python -c pass`` (interpreter start-up, ``site``),
    and the top packages by cumulative time. A package's cumulative time is the sum of the
    cumulative times of its outermost imports (those not made by the same package), so it
    includes what it pulls in that nobody had imported yet; "self" is the time in its own
    modules only. Separately, without ``-X importtime`` (which slows imports down), the wall
    time from spawning the daemon until its ready file appears.
(b) idle memory: VmRSS (``/proc/<pid>/status``, the process and any children) of one broker
    ``--settle`` seconds after it is ready, with no clients, beside a Mosquitto and a
    nats-server started idle on free loopback ports in the same run; also PSS
    (``/proc/<pid>/smaps_rollup``), which shares library pages out fairly.
(c) a local overlay: the wall time of ``trellis up --brokers 40 --dir TMP`` until it returns
    (it returns once every tree link is up), checked with ``trellis topology --json``, the
    total RSS and PSS of its broker processes, then the time of ``trellis down``.

The broker config is the deployed kind: loopback, a free port, the admin HTTP port on (as in
``deploy/compose``), log level "warning". Every process this starts is stopped by its PID, every
wait is bounded, and every port is on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

from peers import free_port, peer_version, wait_until  # noqa: E402

RESULTS = BENCH_DIR / "RESULTS-footprint.md"

READY_TIMEOUT = 60.0  # one daemon: spawn until its ready file appears
LISTEN_TIMEOUT = 10.0  # a peer broker: spawn until its port accepts connections
STOP_TIMEOUT = 10.0  # SIGTERM until SIGKILL
OVERLAY_TIMEOUT = 900.0  # ``trellis up`` of the whole overlay
CLI_TIMEOUT = 120.0  # ``trellis topology`` / ``trellis down``
POLL = 0.002
TOP = 10
PROJECT_PACKAGES = ("broker", "overlay", "security", "reconfig", "analytics")
RESULTS_HEADER = """# Footprint benchmark results

Start-up and idle cost of the broker daemon: import time, spawn-to-ready time, idle memory
beside Mosquitto and nats-server, and a 40-broker local overlay. How it measures is described
at the top of `bench/bench_footprint.py`; each section below was appended by
`bench_footprint.py --write`.
"""


# ---------------------------------------------------------------------------------------
# Processes


def stop_pid(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process we started, wait, SIGKILL if it overruns."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from the parent field of /proc/<n>/stat)."""
    parents: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(stat[stat.rindex(")") + 2 :].split()[1])].append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kib(path: Path, key: str) -> int:
    """The ``key:   N kB`` line of a /proc file, in KiB (0 when the process is gone)."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def rss_kib(pid: int, with_children: bool = True) -> int:
    """VmRSS of ``pid`` (plus its descendants'), in KiB."""
    pids = [pid, *(children_of(pid) if with_children else [])]
    return sum(_kib(Path(f"/proc/{p}/status"), "VmRSS") for p in pids)


def pss_kib(pid: int, with_children: bool = True) -> int:
    """Proportional set size of ``pid`` (plus its descendants'), in KiB."""
    pids = [pid, *(children_of(pid) if with_children else [])]
    return sum(_kib(Path(f"/proc/{p}/smaps_rollup"), "Pss") for p in pids)


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class Daemon:
    """A process this benchmark started, and how long it took to come up."""

    name: str
    proc: subprocess.Popen[bytes]
    ready_s: float
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        stop_pid(self.proc)


@contextlib.contextmanager
def running(start: Callable[[], Daemon]) -> Iterator[Daemon]:
    daemon = start()
    try:
        yield daemon
    finally:
        daemon.stop()


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=log.parent,
            start_new_session=True,
        )


def _check_alive(proc: subprocess.Popen[bytes], log: Path) -> None:
    if proc.poll() is not None:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{tail}")


def broker_config(workdir: Path, name: str) -> tuple[Path, Path]:
    """A deployed-style broker config (TOML) on a free loopback port; (config, ready file)."""
    ready = workdir / f"{name}.ready"
    config = workdir / f"{name}.toml"
    config.write_text(
        f'id = "{name}"\nhost = "127.0.0.1"\nport = 0\nadmin_port = 0\n'
        f'ready_file = "{ready}"\nlog_level = "warning"\n',
        encoding="utf-8",
    )
    return config, ready


def start_trellis(cli: Sequence[str], workdir: Path, name: str = "fp") -> Daemon:
    """``trellis broker --config CFG``; ready when the ready file the config names appears."""
    config, ready = broker_config(workdir, name)
    ready.unlink(missing_ok=True)
    log = workdir / f"{name}.log"
    t0 = time.perf_counter()
    proc = _spawn([*cli, "broker", "--config", str(config)], log)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not ready.exists():
            _check_alive(proc, log)
            if time.monotonic() > deadline:
                raise TimeoutError(f"trellis broker not ready within {READY_TIMEOUT:g} s")
            time.sleep(POLL)
        ready_s = time.perf_counter() - t0
    except BaseException:
        stop_pid(proc)
        raise
    return Daemon("trellis", proc, ready_s, log)


def _start_listening(name: str, cmd: list[str], port: int, log: Path) -> Daemon:
    t0 = time.perf_counter()
    proc = _spawn(cmd, log)
    try:
        deadline = time.monotonic() + LISTEN_TIMEOUT
        while not listening("127.0.0.1", port):
            _check_alive(proc, log)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not listening within {LISTEN_TIMEOUT:g} s")
            time.sleep(POLL)
        ready_s = time.perf_counter() - t0
    except BaseException:
        stop_pid(proc)
        raise
    return Daemon(name, proc, ready_s, log)


def mosquitto_binary() -> str | None:
    found = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    return found if os.access(found, os.X_OK) else None


def nats_binary() -> str | None:
    found = shutil.which("nats-server") or "/usr/sbin/nats-server"
    return found if os.access(found, os.X_OK) else None


def start_mosquitto(workdir: Path) -> Daemon:
    """A private Mosquitto (default limits, anonymous) on a free loopback port."""
    binary = mosquitto_binary()
    if binary is None:
        raise FileNotFoundError("mosquitto is not installed (bash deploy/setup.sh --bench)")
    port = free_port()
    config = workdir / f"mosquitto-{port}.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n", encoding="utf-8")
    return _start_listening(
        "mosquitto", [binary, "-c", str(config)], port, workdir / "mosquitto.log"
    )


def start_nats(workdir: Path) -> Daemon:
    """A private nats-server (defaults: no JetStream, no monitoring) on a free loopback port."""
    binary = nats_binary()
    if binary is None:
        raise FileNotFoundError("nats-server is not installed (bash deploy/setup.sh --bench)")
    port = free_port()
    cmd = [binary, "-a", "127.0.0.1", "-p", str(port)]
    return _start_listening("nats-server", cmd, port, workdir / "nats.log")


# ---------------------------------------------------------------------------------------
# (a) import cost


@dataclass
class ImportProfile:
    """One ``-X importtime`` run: totals and per-package times, in µs."""

    total_us: int
    modules: int
    cumulative: dict[str, int]
    self_us: dict[str, int]
    first_by: dict[str, str]  # package -> the module that first imported it ("-": top level)


def parse_importtime(text: str) -> ImportProfile:
    """Parse ``-X importtime`` stderr (other lines are ignored).

    Lines come child first; a module's depth is its name's indentation (two spaces a level),
    and its parent is the next line one level up.
    """
    entries: list[tuple[int, int, int, str]] = []  # depth, self, cumulative, module
    for line in text.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue
        name = parts[2].rstrip()
        stripped = name.lstrip(" ")
        depth = (len(name) - len(stripped) - 1) // 2
        entries.append((depth, int(parts[0]), int(parts[1]), stripped))
    total = sum(cum for depth, _, cum, _ in entries if depth == 0)
    cumulative: dict[str, int] = defaultdict(int)
    self_us: dict[str, int] = defaultdict(int)
    first_by: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (depth, module) of the enclosing imports
    for depth, own, cum, module in reversed(entries):  # parents before their children
        package = module.split(".")[0]
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if all(outer.split(".")[0] != package for _, outer in stack):  # an outermost import
            cumulative[package] += cum
            first_by[package] = stack[-1][1] if stack else "-"  # ends on the earliest
        self_us[package] += own
        stack.append((depth, module))
    return ImportProfile(total, len(entries), dict(cumulative), dict(self_us), first_by)


def import_profile(cmd: list[str], env: dict[str, str] | None, timeout: float) -> ImportProfile:
    """Run a command that exits by itself under ``-X importtime`` and parse what it printed."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd!r} exited with {out.returncode}: {out.stderr[-2000:]}")
    return parse_importtime(out.stderr)


def daemon_import_profile(python: str, workdir: Path) -> ImportProfile:
    """The daemon's imports up to ready: ``-X importtime`` on the broker, stopped once ready."""
    config, ready = broker_config(workdir, "imp")
    ready.unlink(missing_ok=True)
    log = workdir / "imp.stderr"
    log.unlink(missing_ok=True)
    cmd = [python, "-X", "importtime", "-m", "broker", "broker", "--config", str(config)]
    proc = _spawn(cmd, log)
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, READY_TIMEOUT, "ready", POLL)
        _check_alive(proc, log)
        time.sleep(0.2)  # anything imported right after the ready file is written
        text = log.read_text(errors="replace")  # before SIGTERM: shutdown imports don't count
    finally:
        stop_pid(proc)
    return parse_importtime(text)


def package_kind(package: str) -> str:
    """Where a top-level module comes from: trellis, stdlib, or its distribution's name."""
    if package in PROJECT_PACKAGES:
        return "trellis"
    if package in sys.stdlib_module_names or package in sys.builtin_module_names:
        return "stdlib"
    if package.startswith("__editable__"):
        return "editable-install hook"
    dists = importlib.metadata.packages_distributions().get(package)
    return dists[0] if dists else "other"


# ---------------------------------------------------------------------------------------
# (c) a local overlay


@dataclass
class OverlayRun:
    brokers: int
    up_s: float
    down_s: float
    linked: int
    healthy: int
    rss_kib: int
    pss_kib: int
    note: str = ""


def _cli(cli: Sequence[str], *args: str, timeout: float = CLI_TIMEOUT) -> str:
    out = subprocess.run(
        [*cli, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"trellis {' '.join(args)} exited with {out.returncode}: {out.stderr}")
    return out.stdout


def _overlay_pids(workdir: Path) -> list[int]:
    """Broker PIDs of an overlay directory: those ``overlay.json`` lists, and any process whose
    command line names a file in it (a broker ``trellis up`` had spawned but not yet listed
    when it was interrupted)."""
    pids: set[int] = set()
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        info = json.loads((workdir / "overlay.json").read_text())
        pids.update(int(b["pid"]) for b in info["brokers"])
    marker = str(workdir).encode() + b"/"
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                pids.add(int(entry.name))
    return sorted(pids)


def _reap(pids: Sequence[int]) -> int:
    """SIGTERM then SIGKILL brokers of ours still running; how many there were."""
    ours = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if pid_alive(pid) and b"broker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                ours.append(pid)
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while any(pid_alive(p) for p in ours) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in ours:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return len(ours)


def overlay_run(cli: Sequence[str], brokers: int, scratch: Path) -> OverlayRun:
    workdir = Path(tempfile.mkdtemp(prefix="overlay-", dir=scratch))
    pids: list[int] = []
    try:
        t0 = time.perf_counter()
        _cli(cli, "up", "--brokers", str(brokers), "--dir", str(workdir), timeout=OVERLAY_TIMEOUT)
        up_s = time.perf_counter() - t0
        info = json.loads(_cli(cli, "topology", "--dir", str(workdir), "--json"))
        entries = info["brokers"]
        pids = [int(b["pid"]) for b in entries]
        healthy = sum(1 for b in entries if b.get("health", {}).get("status") == "ok")
        links = {
            tuple(sorted((b["id"], peer)))
            for b in entries
            for peer in b.get("health", {}).get("links", [])
        }
        rss = sum(rss_kib(p) for p in pids)
        pss = sum(pss_kib(p) for p in pids)
        t1 = time.perf_counter()
        _cli(cli, "down", "--dir", str(workdir))
        down_s = time.perf_counter() - t1
        leftover = _reap(pids)
        note = "" if len(entries) == brokers else f"{len(entries)} brokers listed"
        if leftover:
            note = (note + "; " if note else "") + f"{leftover} left after down"
        return OverlayRun(brokers, up_s, down_s, len(links), healthy, rss, pss, note)
    finally:
        _reap(sorted({*pids, *_overlay_pids(workdir)}))


# ---------------------------------------------------------------------------------------
# Running it all


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def span(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    """'median (min–max)', or just the value for one run."""
    if not values:
        return "n/a"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(med(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)

    def add(self, *lines: str) -> None:
        for line in lines:
            self.lines.append(line)
            print(line, flush=True)


def part_imports(python: str, repeat: int, scratch: Path, report: Report) -> None:
    daemon_import_profile(python, scratch)  # warm-up (bytecode caches, page cache): not counted
    baseline = [
        import_profile([python, "-X", "importtime", "-c", "pass"], None, 60) for _ in range(repeat)
    ]
    profiles = [daemon_import_profile(python, scratch) for _ in range(repeat)]
    totals = [p.total_us / 1000 for p in profiles]
    base = [p.total_us / 1000 for p in baseline]
    packages: set[str] = set().union(*(p.cumulative for p in profiles))
    cum = {k: med([p.cumulative.get(k, 0) / 1000 for p in profiles]) for k in packages}
    own = {k: med([p.self_us.get(k, 0) / 1000 for p in profiles]) for k in packages}
    report.add(
        f"### (a) Import cost of the daemon (`-X importtime`, {repeat} runs, ms)",
        "",
        "| what | ms, median (min–max) | modules |",
        "|---|---|---|",
        f"| `python -m broker broker` until ready, all imports | {span(totals, '{:,.1f}')} "
        f"| {profiles[0].modules} |",
        f"| of which interpreter start-up (`python -c pass`) | {span(base, '{:,.1f}')} "
        f"| {baseline[0].modules} |",
        "",
        f"Top {TOP} packages by cumulative import time (medians; Trellis's own packages after "
        "them). Cumulative counts what a package pulls in that was not imported yet; the "
        "importer is the module that imported it first in the first run.",
        "",
        "| package | from | cumulative ms | self ms | first imported by |",
        "|---|---|---|---|---|",
    )
    first_by = profiles[0].first_by
    ranked = sorted(packages, key=lambda k: -cum[k])
    ours = [k for k in ranked if k in PROJECT_PACKAGES]
    for name in [k for k in ranked if k not in PROJECT_PACKAGES][:TOP] + ours:
        report.add(
            f"| {name} | {package_kind(name)} | {cum[name]:,.1f} | {own[name]:,.1f} "
            f"| {first_by.get(name, '?')} |"
        )
    report.add("")


def part_idle(
    cli: Sequence[str], repeat: int, settle: float, scratch: Path, report: Report
) -> None:
    ready: dict[str, list[float]] = defaultdict(list)
    rss: dict[str, list[float]] = defaultdict(list)
    pss: dict[str, list[float]] = defaultdict(list)
    starters: list[tuple[str, Callable[[Path], Daemon]]] = [
        ("trellis", lambda d: start_trellis(cli, d)),
    ]
    if mosquitto_binary():
        starters.append(("mosquitto", start_mosquitto))
    if nats_binary():
        starters.append(("nats-server", start_nats))
    for name, start in starters:  # warm-up (bytecode and page caches): not counted
        start(Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch))).stop()
    for rep in range(repeat):
        for name, start in starters:  # one at a time, so each starts on a quiet machine
            workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=scratch))
            with running(lambda start=start, workdir=workdir: start(workdir)) as daemon:
                time.sleep(settle)
                _check_alive(daemon.proc, daemon.log)
                ready[name].append(daemon.ready_s * 1000)
                rss[name].append(rss_kib(daemon.pid) / 1024)
                pss[name].append(pss_kib(daemon.pid) / 1024)
            print(
                f"  [{rep + 1}/{repeat}] {name:11} ready {ready[name][-1]:7.1f} ms  "
                f"RSS {rss[name][-1]:6.1f} MiB  PSS {pss[name][-1]:6.1f} MiB",
                flush=True,
            )
    report.add(
        f"### (b) Start and idle memory ({repeat} runs; memory {settle:g} s after ready, "
        "no clients)",
        "",
        "| daemon | spawn → ready, ms | idle VmRSS, MiB | idle PSS, MiB | RSS vs trellis |",
        "|---|---|---|---|---|",
    )
    mine = med(rss["trellis"])
    for name, _ in starters:
        ratio = "1" if name == "trellis" else f"trellis = {mine / med(rss[name]):.1f}×"
        report.add(
            f"| {name} | {span(ready[name], '{:,.1f}')} | {span(rss[name], '{:,.1f}')} "
            f"| {span(pss[name], '{:,.1f}')} | {ratio} |"
        )
    report.add(
        "",
        "(trellis: spawn until the ready file appears, i.e. listening on its client and admin "
        "ports; the others: until their port accepts a connection.)",
        "",
    )


def part_overlay(
    cli: Sequence[str], brokers: int, repeat: int, scratch: Path, report: Report
) -> None:
    runs: list[OverlayRun] = []
    for rep in range(repeat):
        run = overlay_run(cli, brokers, scratch)
        runs.append(run)
        print(
            f"  [{rep + 1}/{repeat}] up {run.up_s:6.1f} s, {run.healthy}/{brokers} ok, "
            f"{run.linked} links, RSS {run.rss_kib / 1024:7.1f} MiB, "
            f"PSS {run.pss_kib / 1024:7.1f} MiB, down {run.down_s:5.1f} s {run.note}",
            flush=True,
        )
    notes = sorted({r.note for r in runs if r.note})
    report.add(
        f"### (c) A {brokers}-broker local overlay (`trellis up --brokers {brokers}`, a line; "
        f"{repeat} runs)",
        "",
        "| what | median (min–max) |",
        "|---|---|",
        f"| `trellis up` wall time, s | {span([r.up_s for r in runs], '{:,.1f}')} |",
        f"| per broker, s | {span([r.up_s / brokers for r in runs], '{:,.2f}')} |",
        f"| brokers reporting ok / links up (`trellis topology`) "
        f"| {min(r.healthy for r in runs)}/{brokers} ok, "
        f"{min(r.linked for r in runs)}/{brokers - 1} links (worst run) |",
        f"| total VmRSS of the brokers, MiB | {span([r.rss_kib / 1024 for r in runs])} |",
        f"| total PSS of the brokers, MiB | {span([r.pss_kib / 1024 for r in runs])} |",
        f"| per broker VmRSS, MiB "
        f"| {span([r.rss_kib / 1024 / brokers for r in runs], '{:,.1f}')} |",
        f"| `trellis down` wall time, s | {span([r.down_s for r in runs], '{:,.1f}')} |",
        *([f"| notes | {'; '.join(notes)} |"] if notes else []),
        "",
    )


def _git_commit() -> str:
    """HEAD, and the last commit that changed the daemon's code (what this measures)."""
    code = ["--", *PROJECT_PACKAGES]
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        last = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h", *code],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", *code],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "?"
    text = f"{head} (Trellis packages last changed in {last}"
    return text + (", plus uncommitted changes)" if dirty else ")")


def environment(python: str) -> list[str]:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    pyver = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True, text=True, timeout=30, check=False,
    ).stdout.strip()  # fmt: skip
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return [
        f"- machine: nproc {os.cpu_count()} ({model}), Linux {platform.release()}, "
        f"load average at start {load}",
        f"- Python {pyver or '?'} ({python}); commit {_git_commit()}",
        f"- peers: {peer_version([mosquitto_binary() or 'mosquitto', '-h'])}; "
        f"{peer_version([nats_binary() or 'nats-server', '--version'])}",
    ]


def append_results(path: Path, heading: str, command: str, env: list[str], body: list[str]) -> None:
    """Append one dated section to ``path`` (created with a title if missing)."""
    text = path.read_text(encoding="utf-8") if path.exists() else RESULTS_HEADER
    section = [f"## {heading}", "", f"Command: `{command}`", "", *env, "", *body]
    path.write_text(text.rstrip("\n") + "\n\n" + "\n".join(section).rstrip("\n") + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of (a) and (b) (default 5)")
    parser.add_argument("--overlay-repeat", type=int, default=3, help="runs of (c) (default 3)")
    parser.add_argument("--brokers", type=int, default=40, help="overlay size for (c)")
    parser.add_argument("--parts", default="a,b,c", help="which of a,b,c to run")
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds idle before reading memory"
    )
    parser.add_argument("--quick", action="store_true", help="1 run each, a 10-broker overlay")
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter with Trellis installed"
    )
    parser.add_argument(
        "--trellis", help="the trellis console script to use (default: PYTHON -m broker)"
    )
    parser.add_argument("--write", action="store_true", help=f"append to {RESULTS.name}")
    parser.add_argument("--label", default="", help="heading text for --write")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat, args.overlay_repeat = 1, 1
        args.brokers = min(args.brokers, 10)
    parts = set(args.parts.split(","))
    if not parts <= {"a", "b", "c"} or args.repeat < 1 or args.overlay_repeat < 1:
        parser.error("--parts takes a, b and/or c; repeats must be positive")
    cli = [args.trellis] if args.trellis else [args.python, "-m", "broker"]
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop every process started here.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    words = [Path(__file__).name, *(sys.argv[1:] if argv is None else argv)]
    command = f"cd {REPO} && .venv/bin/python bench/{shlex.join(words)}"
    env = environment(args.python)
    report = Report()
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="bench-footprint-"))
    try:
        if "a" in parts:
            print("(a) import cost ...", flush=True)
            part_imports(args.python, args.repeat, scratch, report)
        if "b" in parts:
            print("(b) start and idle memory ...", flush=True)
            part_idle(cli, args.repeat, args.settle, scratch, report)
        if "c" in parts:
            print(f"(c) {args.brokers}-broker overlay ...", flush=True)
            part_overlay(cli, args.brokers, args.overlay_repeat, scratch, report)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"(total {elapsed:.0f} s)")
    if args.write:
        now = dt.datetime.now().strftime("%Y-%m-%d %H:%M")
        heading = f"{now}" + (f" — {args.label}" if args.label else "")
        body = [*report.lines, f"(total {elapsed:.0f} s)"]
        append_results(RESULTS, heading, command, env, body)
        print(f"appended to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
