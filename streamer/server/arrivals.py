"""When each stretch of a stream's audio arrived: the clock behind every message's ``latency_ms``.

A session records, per received frame, how many samples had arrived and when; a transcript's latency is the time
since the arrival of the last sample its text needed. The log forgets what no transcript can refer to any more, so a
session of hours holds a few seconds' worth of entries, not one per frame since it opened.
"""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["ArrivalLog"]


class ArrivalLog:
    """``record(n, t)``: the first ``n`` samples had all arrived at time ``t`` (``n`` never decreases)."""

    def __init__(self) -> None:
        self._samples: list[int] = []
        self._at: list[float] = []

    def __len__(self) -> int:
        return len(self._samples)

    def record(self, samples: int, at: float) -> None:
        self._samples.append(samples)
        self._at.append(at)

    def arrival_of(self, count: int) -> float | None:
        """When the first ``count`` samples had all arrived: the first record of at least ``count``, or the newest
        record when none is yet; None before any record."""
        if not self._at:
            return None
        index = min(bisect_left(self._samples, count), len(self._at) - 1)
        return self._at[index]

    def forget_before(self, count: int) -> None:
        """Drop the records that no :meth:`arrival_of` of ``count`` or more reads. Amortised O(1) per record: the
        lists are cut only once at least half of them is dead."""
        cut = bisect_left(self._samples, count)  # the first record :meth:`arrival_of` of ``count`` may read
        if cut and cut * 2 >= len(self._samples):
            del self._samples[:cut]
            del self._at[:cut]
