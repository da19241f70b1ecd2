"""The WAL file read frame by frame, and the rule of what a power cut can leave of it.

The WAL file's format (https://www.sqlite.org/fileformat2.html#walformat):
a 32-byte header (bytes 8-11: the page size, big-endian), then frames, each
a 24-byte header and one page. In a frame header bytes 0-3 hold the page
number and bytes 4-7, for a commit frame, the size of the database in pages
after the commit; zero for every other frame. Recovery replays frames up to
the last valid commit frame.

What a cut can leave: at ``synchronous=FULL`` SQLite fsyncs the log before
a commit returns, and that fsync makes every frame written before it
durable too; a commit at NORMAL is written but not fsynced, so a tail of
such frames may be lost. SQLite's recovery ignores frames after the last
whole commit. ``prefixes`` turns this into the list of images to check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

WAL_HEADER_BYTES = 32
FRAME_HEADER_BYTES = 24


@dataclass(frozen=True, slots=True)
class Frame:
    """One WAL frame's header: the page it holds, and the database size in
    pages after the commit if it is a commit frame (0 otherwise)."""

    page: int
    commit_size: int

    @property
    def is_commit(self) -> bool:
        return self.commit_size != 0


def read_wal(path: str | os.PathLike[str]) -> tuple[int, list[Frame]]:
    """The page size and every whole frame header of the WAL file ``path``."""
    data = Path(path).read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    step = FRAME_HEADER_BYTES + page_size
    return page_size, [Frame(int.from_bytes(data[at:at + 4], "big"),
                             int.from_bytes(data[at + 4:at + 8], "big"))
                       for at in range(WAL_HEADER_BYTES, len(data) - step + 1, step)]


def wal_length(page_size: int, frames: int) -> int:
    """Bytes of a WAL file holding ``frames`` frames."""
    return WAL_HEADER_BYTES + frames * (FRAME_HEADER_BYTES + page_size)


@dataclass(frozen=True, slots=True)
class Prefix:
    """A power cut after ``cut`` commits returned that leaves the first ``kept``."""

    cut: int
    kept: int
    frames: int


def prefixes(frames: Sequence[Frame], durable: Sequence[bool]) -> list[Prefix]:
    """Every ``(cut, kept)`` a power cut can leave of this log.

    ``durable[i]`` says whether the ``i``-th commit frame's transaction was
    fsynced. A cut after commit ``cut`` keeps whole commits only, at least up
    to the last durable commit at or before ``cut``: an fsync covers every
    frame written before it.
    """
    ends = [n + 1 for n, frame in enumerate(frames) if frame.is_commit]
    if len(ends) != len(durable):
        raise ValueError(f"{len(ends)} commit frames, {len(durable)} durability flags")
    ends.insert(0, 0)  # kept 0: nothing of the run, the file as it was
    offered, floor = [], 0
    for cut in range(len(ends)):
        if cut and durable[cut - 1]:
            floor = cut
        offered.extend(Prefix(cut, kept, ends[kept]) for kept in range(floor, cut + 1))
    return offered
