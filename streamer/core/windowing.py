"""The audio the core still needs, and when to decode which part of it.

:class:`AudioBuffer` holds samples by absolute stream position and forgets what is trimmed, so memory stays bounded
by the uncommitted audio (at most a window plus what arrived while decoding). :func:`next_window` is the sliding
window policy of whisper_streaming (Machacek et al. 2023, "Turning Whisper into Real-Time Transcription System"):
while speech goes on, decode ``[committed, latest speech)`` every ``step`` of new audio, capped at 30 s; once words
are committed the window start moves to the end of the last committed word.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamer.core.units import N_SAMPLES

__all__ = ["AudioBuffer", "Window", "WindowPolicy", "next_window"]

AudioArray = npt.NDArray[np.float32]

# storage an AudioBuffer allocates, as a multiple of the live samples it must hold (any factor above 1 keeps appends
# amortised O(n); a small one keeps the dead room small)
GROWTH = 1.25
# and at least this many samples (a 100 ms chunk's worth of room is enough to avoid tiny reallocations)
MIN_STORAGE = 4096


class AudioBuffer:
    """Float32 samples indexed by absolute stream position ``[start, end)``.

    :meth:`append` adds samples at :attr:`end`; :meth:`trim_before` forgets everything before a position. Storage is
    compacted when more than half of it is dead, and grows (or is compacted) to :data:`GROWTH` times the live
    samples, so appends and trims are amortised O(n) and a stream holds at most about 1.25 times its live audio
    (doubling held twice: 1.3 MB more for a 20-second window, 10 MB over a server's 8 streams).
    """

    def __init__(self, start: int = 0) -> None:
        self._data = np.zeros(1024, dtype=np.float32)
        self._offset = 0  # index in _data of position `start`
        self._start = start
        self._end = start

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._end

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def capacity(self) -> int:
        """Samples of storage currently allocated (for memory tests and metrics)."""
        return int(self._data.size)

    def append(self, samples: npt.ArrayLike) -> None:
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        used = self._offset + len(self)
        if used + x.size > self._data.size:
            live = self._data[self._offset : used]
            size = _storage(live.size + x.size)
            if size > self._data.size:
                data = np.zeros(size, dtype=np.float32)
                data[: live.size] = live
                self._data = data
            else:  # room enough once the dead samples before the live ones go (numpy copies overlaps safely)
                self._data[: live.size] = live
            self._offset, used = 0, live.size
        self._data[used : used + x.size] = x
        self._end += x.size

    def slice(self, start: int, end: int) -> AudioArray:
        """A copy of ``[start, end)``; raises ``ValueError`` if any of it was trimmed or has not arrived."""
        if not self._start <= start <= end <= self._end:
            raise ValueError(f"[{start}, {end}) is outside the buffered [{self._start}, {self._end})")
        i = self._offset + start - self._start
        return self._data[i : i + end - start].copy()

    def trim_before(self, position: int) -> None:
        """Forget samples before ``position`` (clamped to the buffered range)."""
        position = min(max(position, self._start), self._end)
        self._offset += position - self._start
        self._start = position
        if self._offset > self._data.size // 2:
            live = self._data[self._offset : self._offset + len(self)].copy()
            self._data = np.zeros(_storage(live.size), dtype=np.float32)
            self._data[: live.size] = live
            self._offset = 0


def _storage(samples: int) -> int:
    """Samples of storage for ``samples`` live ones."""
    return max(MIN_STORAGE, int(samples * GROWTH) + 1)


@dataclass(frozen=True)
class WindowPolicy:
    """When a window is due and how long it may be (samples)."""

    # a new window is due after this much new speech audio
    step: int = 16000
    # the longest window the model can take
    max_window: int = N_SAMPLES


@dataclass(frozen=True)
class Window:
    """``[start, end)`` to decode. ``final`` windows close their utterance: everything in them is committed."""

    start: int
    end: int
    final: bool

    def __len__(self) -> int:
        return self.end - self.start


def next_window(
    policy: WindowPolicy,
    committed: int,
    decoded: int,
    speech_end: int,
    closed: bool,
    anchor: int | None = None,
    paused: bool = False,
) -> Window | None:
    """The window to decode now for one utterance, or None if none is due.

    ``committed``: end of the audio already committed; ``decoded``: end of the last window sent; ``speech_end``: end
    of the utterance's speech received so far; ``closed``: the utterance has ended (endpoint, finalize or end of
    stream), so one last window covering all of it is due; ``anchor``: where windows start (at or before
    ``committed``; default ``committed``) -- re-reading committed audio gives the model the context it was trained
    on, and the committed words are then recognised and skipped; ``paused``: the utterance's speech has paused (it
    ends where it stands unless speech resumes), so a window covering all of it is due however little is new, ahead
    of the end point that would close it. A window that would exceed ``max_window`` keeps its end and moves its start;
    the caller must commit what falls before it.
    """
    start = committed if anchor is None else min(anchor, committed)
    if closed:
        if speech_end <= committed:
            return None
        return Window(max(start, speech_end - policy.max_window), speech_end, True)
    new = speech_end - max(decoded, committed)
    if new < policy.step and not (paused and new > 0):
        return None
    return Window(max(start, speech_end - policy.max_window), speech_end, False)
