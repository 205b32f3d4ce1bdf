"""Helpers for tests that use the SDK."""

from __future__ import annotations

import asyncio

from broker.client import Delivery, Subscription


async def drain(sub: Subscription, idle: float = 0.5) -> list[Delivery]:
    """Everything a subscription receives until it has been idle for ``idle`` seconds."""
    got: list[Delivery] = []
    while True:
        try:
            got.append(await asyncio.wait_for(sub.__anext__(), idle))
        except TimeoutError:
            return got
