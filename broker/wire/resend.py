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
    """The newest frames within ``budget`` bytes (at least seven eighths of it, when there
    were that many), oldest first."""

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
        """Drop the oldest frames until the rest fit in seven eighths of the budget: trimmed
        to the budget exactly, a full buffer would be trimmed again at every frame kept (on
        a broker, at every delivery)."""
        frames, size, target = self.frames, self.size, self.budget - self.budget // 8
        popleft = frames.popleft
        while size > target:
            size -= len(popleft())
        self.size = size

    def take(self) -> list[bytes]:
        """The frames kept, oldest first; empties."""
        frames = list(self.frames)
        self.frames.clear()
        self.size = 0
        return frames
