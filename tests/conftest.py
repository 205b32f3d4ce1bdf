"""Fixtures shared by the suite: real broker processes on ephemeral ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.launcher import BrokerProcess, start_broker


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
