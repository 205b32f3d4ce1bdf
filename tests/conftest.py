"""Fixtures shared by the suite: real broker processes on ephemeral ports."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.tools.launcher import BrokerProcess, start_broker
from broker.tools.local import LocalOverlay, port_range, start_overlay
from overlay.tree import Tree


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker draws its brokers' ports from its own slice of the
    range, so two workers never reserve the same port between release and bind (the
    commands a test spawns inherit the slice)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2 or "TRELLIS_PORT_RANGE" in os.environ:
        return
    low, high = port_range()
    width = (high - low) // count
    start = low + int(worker[2:]) * width
    os.environ["TRELLIS_PORT_RANGE"] = f"{start}-{start + width}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist the files with slow tests go first, so the many quick files fill
    the end and both workers finish together. xdist's own reorder (most tests per file
    first) left files of one long test (a Spark cluster, an adaptive cycle) for the very
    end, with the other worker idle; pyproject.toml turns it off."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


@pytest.fixture
def run_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start broker daemons for one test; every one is stopped (SIGTERM) afterwards."""
    started: list[BrokerProcess] = []

    def _run(broker_id: str = "b1", **settings: Any) -> BrokerProcess:
        proc = start_broker(tmp_path / "brokers", broker_id, settings=settings)
        started.append(proc)
        return proc

    yield _run
    for proc in started:
        proc.stop()


@pytest.fixture
def broker(run_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """One running broker with default settings."""
    return run_broker()


@pytest.fixture
def run_overlay(tmp_path: Path) -> Iterator[Callable[..., LocalOverlay]]:
    """Start local overlays (trees of VNs of broker processes) for one test; all are
    stopped afterwards. Keyword settings go into every broker's config."""
    started: list[LocalOverlay] = []

    def _run(
        tree: Tree,
        *,
        name: str | None = None,
        replicas: dict[str, int] | None = None,
        overrides: dict[str, dict[str, Any]] | None = None,
        tls: bool = False,
        **settings: Any,
    ) -> LocalOverlay:
        workdir = tmp_path / (name or f"overlay{len(started)}")
        overlay = start_overlay(
            workdir, tree, settings, replicas=replicas, overrides=overrides, tls=tls
        )
        started.append(overlay)
        return overlay

    yield _run
    for overlay in started:
        overlay.stop()
