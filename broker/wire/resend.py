"""The newest frames sent on a connection, kept to send again when its session resumes.

Both ends of a client connection keep them (the client its publications, the broker its
deliveries): what was written just before a connection was lost may have died in the socket
buffers, and the receiver drops what it had already (by publisher and seq). The bound is in
bytes, not frames: what dies in flight is what the socket buffers held, so a budget in
frames kept a hundred small deliveries where thousands can be in flight.
"""

from __future__ import annotations

from collections import deque


class RecentFrames:
    """The newest frames within ``budget`` bytes, oldest first."""

    __slots__ = ("budget", "frames", "size")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.frames: deque[bytes] = deque()
        self.size = 0

    def keep(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.size += len(frame)
        if self.size > self.budget:
            self.trim()

    def trim(self) -> None:
        """Drop the oldest frames until the rest fit the budget."""
        frames = self.frames
        while self.size > self.budget:
            self.size -= len(frames.popleft())

    def take(self) -> list[bytes]:
        """The frames kept, oldest first; empties."""
        frames = list(self.frames)
        self.frames.clear()
        self.size = 0
        return frames
