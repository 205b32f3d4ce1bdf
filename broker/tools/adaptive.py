"""``trellis up --adaptive``: the closed loop of SPEC §6 on a local overlay.

Every ``interval`` seconds a *cycle* runs: take the traffic logs of the last few intervals
(the brokers start a new log file every interval, so each cycle's snapshot is whole files:
hard links, so a file the brokers' retention deletes meanwhile stays readable), run the
analytics job on them (``trellis analytics run``, PySpark, in a subprocess: a minute or two,
never on this event loop), plan a trust-aware rebuild from the outputs and the live tree
(:func:`broker.tools.trust_cli.plan_for_overlay`, in a thread), and apply its moves live
(:func:`broker.tools.rebuild_apply.apply_moves_live`). A tick that finds the previous cycle
still running is recorded as skipped rather than queued.

Each cycle is a JSON line in ``DIR/adaptive-cycles.jsonl`` (what ``trellis reconfig`` prints
too): its times (job, plan, moves), the VNs' trust, the plan's cost and social trust before
and after, the moves and what became of them. The moves themselves are rounds at the master
brokers, tagged ``cycle N move i/k`` in their ``/reconfig`` history and counted in their
``trellis_reconfig_requested_moves_total`` metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.tools.adaptive_cycles import append_cycle
from broker.tools.rebuild_apply import apply_moves_live
from broker.tools.trust_cli import plan_for_overlay, save_state

__all__ = ["AdaptiveSettings", "adaptive_broker_settings", "run_adaptive", "run_cycle"]

log = logging.getLogger("trellis.adaptive")

WORK_DIR = "adaptive"
"""Each cycle's log snapshot and analytics outputs, under the overlay's directory."""

# (log snapshot, output directory) -> the job's summary; raises on failure.
Job = Callable[[Path, Path], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class AdaptiveSettings:
    """How the loop runs.

    Attributes:
        interval: seconds between cycles (the brokers' log files rotate at this period).
        history: intervals of logs each cycle's job reads (older evidence ages out, so a
            broker whose faults stopped regains trust).
        epsilon: the rebuild's cost budget, ``(1 + epsilon) ×`` the best cost found.
        cycles: stop after this many cycles (None: until interrupted).
        job_timeout: seconds the analytics job may take before the cycle gives up.
        master: the Spark master of the job.
    """

    interval: float = 120.0
    history: int = 2
    epsilon: float = 0.1
    cycles: int | None = None
    job_timeout: float = 600.0
    master: str = "local[2]"


def spark_job(settings: AdaptiveSettings) -> Job:
    """The analytics job as a subprocess (``trellis analytics run``), killed on cancel."""

    async def run(logs: Path, out: Path) -> dict[str, Any]:
        argv = [
            *(sys.executable, "-m", "broker", "analytics", "run", "--logs", str(logs)),
            *("--out", str(out), "--window", "1e9", "--master", settings.master, "--json"),
        ]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            async with asyncio.timeout(settings.job_timeout):
                stdout, stderr = await proc.communicate()
        except BaseException as exc:  # timeout, or the loop stopped: the job goes too
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            if isinstance(exc, TimeoutError):
                raise RuntimeError(
                    f"analytics job still running after {settings.job_timeout:g} s; killed"
                ) from None
            raise
        if proc.returncode != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"analytics job exited {proc.returncode}: {' | '.join(tail)}")
        summary: dict[str, Any] = json.loads(stdout)
        return summary

    return run


def snapshot_logs(logs: Path, into: Path, since: float) -> int:
    """Hard-link every traffic-log file under ``logs`` written to since ``since`` (Unix
    time) into ``into``, keeping the per-broker directories; the number of files."""
    count = 0
    for path in sorted(logs.rglob("traffic-*")):
        if not path.is_file() or path.stat().st_mtime < since:
            continue
        target = into / path.relative_to(logs)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)  # another file system: a copy will do
        count += 1
    return count


async def run_cycle(
    workdir: Path, number: int, settings: AdaptiveSettings, job: Job
) -> dict[str, Any]:
    """One cycle: logs, job, plan, moves. Returns its record (also appended to the file)."""
    started = time.time()
    record: dict[str, Any] = {"cycle": number, "time": started}
    cycle_dir = workdir / WORK_DIR / f"cycle-{number}"
    shutil.rmtree(cycle_dir, ignore_errors=True)
    logs, out = cycle_dir / "logs", cycle_dir / "out"
    try:
        since = started - settings.history * settings.interval
        files = await asyncio.to_thread(snapshot_logs, workdir / "traffic", logs, since)
        record["log_files"] = files
        if not files:
            record["outcome"] = "no traffic logs yet"
            return record
        t0 = time.monotonic()
        summary = await job(logs, out)
        record["job_seconds"] = time.monotonic() - t0
        record["records"] = summary.get("records")
        t0 = time.monotonic()
        planned = await asyncio.to_thread(plan_for_overlay, workdir, out, epsilon=settings.epsilon)
        record["plan_seconds"] = time.monotonic() - t0
        plan = planned.plan
        record["trust"] = dict(planned.trust)
        record["plan"] = plan.to_dict()
        t0 = time.monotonic()
        report = await apply_moves_live(
            planned.info, plan.before, plan.moves, tag=f"cycle {number}"
        )
        record["moves_seconds"] = time.monotonic() - t0
        record["applied"] = report.to_dict()
        if report.ok:
            await asyncio.to_thread(save_state, workdir, plan)
            record["outcome"] = (
                f"applied {len(plan.moves)} move(s)" if plan.moves else f"kept ({plan.reason})"
            )
        else:
            record["outcome"] = f"moves stopped: {report.state}"
    except asyncio.CancelledError:
        record["outcome"] = "interrupted"
        raise
    except Exception as exc:  # a failed cycle is recorded; the loop goes on
        log.warning("adaptive cycle %d failed: %s", number, exc)
        record["outcome"] = f"failed: {exc}"
    finally:
        record["seconds"] = time.time() - started
        append_cycle(workdir, record)
        _prune(workdir / WORK_DIR, keep=number - 1)
    return record


def _prune(root: Path, keep: int) -> None:
    """Remove the work directories of cycles before ``keep`` (the last two stay)."""
    if not root.is_dir():
        return
    for path in root.glob("cycle-*"):
        with contextlib.suppress(ValueError):
            if int(path.name.removeprefix("cycle-")) < keep:
                shutil.rmtree(path, ignore_errors=True)


async def run_adaptive(
    workdir: Path,
    settings: AdaptiveSettings,
    job: Job | None = None,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> int:
    """Run cycles every ``settings.interval`` until ``settings.cycles`` ran (or forever);
    returns the number of cycles that ran. A tick while a cycle runs is recorded as
    skipped. Cancelling stops the running cycle (and its job)."""
    job = job or spark_job(settings)

    async def _reported(cycle: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        record = await cycle
        if report is not None:
            report(record)
        return record

    ran = 0
    number = 0
    current: asyncio.Task[dict[str, Any]] | None = None
    try:
        while settings.cycles is None or ran < settings.cycles:
            await asyncio.sleep(settings.interval)
            number += 1
            if current is not None and not current.done():
                skipped = {
                    "cycle": number,
                    "time": time.time(),
                    "outcome": "skipped: the previous cycle is still running",
                }
                append_cycle(workdir, skipped)
                if report is not None:
                    report(skipped)
                continue
            current = asyncio.create_task(_reported(run_cycle(workdir, number, settings, job)))
            ran += 1
        if current is not None:
            await current
    finally:
        if current is not None and not current.done():
            current.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await current
    return ran


def adaptive_broker_settings(interval: float, ocbr_turns: bool) -> dict[str, Any]:
    """What the brokers of an adaptive overlay need: reconfiguration on (they take the
    loop's moves), their own OCBR turns off unless asked for (an OCBR round may undo a
    trust plan: it lowers cost, and may re-link a distrusted VN into a transit position),
    and a new log file every interval."""
    return {
        "reconfig": {"enabled": True, **({} if ocbr_turns else {"interval": NO_TURNS})},
        "traffic_log": {"rotate_seconds": interval},
    }


NO_TURNS = 10.0**9
"""A master-turn interval that never comes (about 30 years): the brokers only run the
rounds an operator asks for."""
