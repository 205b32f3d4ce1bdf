"""The same job on a Spark standalone cluster: a master and a worker started here with
Spark's own launcher (``spark-class``, shipped in the pyspark package), the job submitted to
``spark://`` and its outputs equal to the pure-Python reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from analytics import reference
from analytics.generate import generate
from analytics.schema import read_records
from broker.tools.local import free_ports

pyspark = pytest.importorskip("pyspark")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = pytest.mark.slow

WINDOW = 30.0


def wait_for_line(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(encoding="utf-8", errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    log = path.read_text(encoding="utf-8", errors="replace")[-3000:] if path.exists() else ""
    raise AssertionError(f"no {text!r} in {path.name} within {timeout:g} s:\n{log}")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one worker (1 core, 1 GiB); both stopped by PID after."""
    home = Path(pyspark.__file__).parent
    spark_class = str(home / "bin" / "spark-class")
    port, master_ui, worker_ui = free_ports(3)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    url = f"spark://127.0.0.1:{port}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        with (tmp_path / "master.log").open("wb") as out:
            started.append(
                subprocess.Popen(
                    [
                        spark_class,
                        "org.apache.spark.deploy.master.Master",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--webui-port",
                        str(master_ui),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        wait_for_line(tmp_path / "master.log", "I have been elected leader", started[0], 90)
        with (tmp_path / "worker.log").open("wb") as out:
            started.append(
                subprocess.Popen(
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        url,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "1",
                        "--memory",
                        "1g",
                        "--webui-port",
                        str(worker_ui),
                        "--work-dir",
                        str(tmp_path / "work"),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        wait_for_line(
            tmp_path / "worker.log", "Successfully registered with master", started[1], 90
        )
        yield url
    finally:
        for proc in reversed(started):
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def rows(out: Path, name: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = pq.read_table(out / name).to_pylist()
    for r in got:
        assert r.pop("version") == 1
    return got


def test_the_job_runs_on_a_standalone_cluster(standalone: str, tmp_path: Path) -> None:
    logs, out = tmp_path / "logs", tmp_path / "out"
    generate(logs, 400, window=WINDOW, rate=10.0)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "analytics.job",
            "--logs",
            str(logs),
            "--out",
            str(out),
            "--window",
            f"{WINDOW:g}s",
            "--master",
            standalone,
            "--json",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["windows"] >= 2
    want = reference.compute(read_records(logs), WINDOW)
    for table in reference.TABLES:
        columns = reference.TABLES[table]

        def key(r: dict[str, Any], columns: tuple[str, ...] = columns) -> tuple[str, ...]:
            return tuple(str(r[c]) for c in columns)

        assert sorted(rows(out, table), key=key) == sorted(want[table], key=key), table
    # The worker ran the tasks (its work directory holds the application's executor).
    assert any((tmp_path / "work").iterdir())
