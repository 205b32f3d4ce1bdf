"""Helpers shared by tests: the SDK, and the `trellis` command run as a user would."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from broker.client import Delivery, Subscription


async def drain(sub: Subscription, idle: float = 0.5) -> list[Delivery]:
    """Everything a subscription receives until it has been idle for ``idle`` seconds."""
    got: list[Delivery] = []
    while True:
        try:
            got.append(await asyncio.wait_for(sub.__anext__(), idle))
        except TimeoutError:
            return got


def trellis(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``trellis ARGS`` (as ``python -m broker``) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
