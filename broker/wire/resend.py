"""The newest frames sent on a connection, kept to send again when its session resumes.

Both ends of a client connection keep them (the client its publications, the broker its
deliveries): what was written just before a connection was lost may have died in the socket
buffers, and the receiver drops what it had already (by publisher and seq). The bound is in
bytes, not frames: what dies in flight is what the socket buffers held, so a budget in
frames kept a hundred small deliveries where thousands can be in flight.

Both keep them once per write (:meth:`RecentFrames.keep_written`: the write's list of frames,
held as it is), not once per frame: at hundreds of thousands of deliveries a second, a method
call and a trim step per delivery were a tenth of the broker's CPU.
"""

from __future__ import annotations

from collections import deque
from itertools import chain


class RecentFrames:
    """The newest frames within ``budget`` bytes (at least seven eighths of it, when there
    were that many), oldest first.

    Frames are held in runs (one per :meth:`keep_all`), so trimming drops whole runs and
    cuts into one only when the oldest run left holds more than the trim must drop."""

    __slots__ = ("budget", "runs", "size")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.runs: deque[tuple[int, list[bytes]]] = deque()  # (bytes, frames), oldest first
        self.size = 0

    def keep(self, frame: bytes) -> None:
        self.keep_all([frame])

    def keep_written(
        self, frames: list[bytes], others: list[bytes], largest: int | None = None
    ) -> None:
        """Keep the frames of one write but ``others`` (frames among them not to keep) and
        those over ``largest`` bytes; ``frames`` may be held, not copied. In the usual
        write (nothing to leave out) no frame is looked at in Python."""
        if others:
            skip = set(map(id, others))
            frames = [frame for frame in frames if id(frame) not in skip]
        if largest is not None and frames and max(map(len, frames)) > largest:
            frames = [frame for frame in frames if len(frame) <= largest]
        if frames:
            self.keep_all(frames)

    def keep_all(self, frames: list[bytes]) -> None:
        """Keep ``frames`` (newest last). The list itself is held: the caller must not change
        it afterwards."""
        size = sum(map(len, frames))
        self.runs.append((size, frames))
        self.size += size
        if self.size > self.budget:
            self.trim()

    def trim(self) -> None:
        """Drop the oldest frames until the rest fit in seven eighths of the budget: trimmed
        to the budget exactly, a full buffer would be trimmed again at every frame kept (on
        a broker, at every write)."""
        runs, size, target = self.runs, self.size, self.budget - self.budget // 8
        while size > target:
            run_size, frames = runs[0]
            if size - run_size > target:
                runs.popleft()
                size -= run_size
                continue
            # Cut the oldest run: the rest of the buffer alone would hold too little (or
            # just enough, and the run may end in frames that fit: empty ones).
            cut = 0
            while size > target:
                size -= len(frames[cut])
                run_size -= len(frames[cut])
                cut += 1
            if cut == len(frames):
                runs.popleft()
            else:
                runs[0] = (run_size, frames[cut:])
        self.size = size

    def take(self) -> list[bytes]:
        """The frames kept, oldest first; empties."""
        frames = list(chain.from_iterable(run for _, run in self.runs))
        self.runs.clear()
        self.size = 0
        return frames
