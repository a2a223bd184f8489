"""One channel of a ``/v1/listen`` session: its stream core behind the scheduler, and the accounting that names every
sample of it (transcribed, non-speech, lost) and carries it to another replica (:mod:`streamer.server.resume`)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from streamer.core.audio import Resampler
from streamer.core.stream import StreamCore
from streamer.core.units import SAMPLE_RATE
from streamer.server.resume import ChannelRecord
from streamer.server.speaker_worker import SpeakerCoreClient

__all__ = ["ListenChannel"]


class ListenChannel(SpeakerCoreClient):
    """One channel of a session: its core (with its resampler) and what it has accounted for. A channel taken over
    from a record (:class:`~streamer.server.resume.ChannelRecord`) starts where that one stood."""

    def __init__(
        self,
        on_update: Callable[[], None],
        index: int,
        core: StreamCore,
        sample_rate: int,
        taken: ChannelRecord | None = None,
        skip: int = 0,
    ) -> None:
        super().__init__(core, sample_rate, on_update)
        self.index = index
        taken = taken or ChannelRecord(accounted=0, next_segment_id=0)
        # accounted samples (stream time), and the spans accounted, to name what is missing if we give up waiting
        self.transcribed = taken.transcribed
        self.non_speech = taken.non_speech
        self.lost = taken.lost
        self.spans: list[tuple[int, int]] = [(0, taken.accounted)] if taken.accounted else []
        # every sample before this is accounted for; the segment id after the last one accounted (the record's)
        self.accounted = taken.accounted
        self.next_segment_id = taken.next_segment_id
        # resampled samples to drop before the core: the client resends from a frame before `accounted` (see Takeover)
        self.skip = skip

    def resample(self, samples: npt.NDArray[np.float32], rate: int) -> list[npt.NDArray[np.float32]]:
        """``samples`` at ``rate``, at 16 kHz: the resampler follows the rate (a container's is known once its header
        is in, and a resumed stream's next file may have another), so a change first flushes the old one's tail."""
        if self.resampler.rate_in == rate:
            return [self.resampler.process(samples)]
        tail = self.resampler.flush()
        self.resampler = Resampler(rate, SAMPLE_RATE)
        return [tail, self.resampler.process(samples)]

    def feed(self, samples: npt.NDArray[np.float32]) -> int:
        """Give the core 16 kHz ``samples``, less what a takeover's client resends that the record accounted for
        already (:attr:`skip`); how many it took."""
        if self.skip:
            dropped = min(self.skip, len(samples))
            self.skip -= dropped
            samples = samples[dropped:]
        if len(samples):
            self.receive_audio(samples)
        return len(samples)

    def record(self) -> ChannelRecord:
        context_start = min(self.core.context_start, self.accounted)
        return ChannelRecord(
            self.accounted, self.next_segment_id, self.transcribed, self.non_speech, self.lost, context_start
        )

    def position(self) -> tuple[int, int]:
        """What a takeover needs of this channel's place (its record changes when this does)."""
        return self.accounted, self.core.context_start

    def account(self, start: int, end: int) -> None:
        self.spans.append((start, end))
        self.accounted = max(self.accounted, end)
        self.next_segment_id = self.core.next_segment_id

    def gaps(self) -> list[tuple[int, int]]:
        """Spans of received audio no final, non-speech or lost event has covered."""
        gaps: list[tuple[int, int]] = []
        cursor = 0
        for start, end in sorted(self.spans):
            if start > cursor:
                gaps.append((cursor, start))
            cursor = max(cursor, end)
        if cursor < self.core.samples_received:
            gaps.append((cursor, self.core.samples_received))
        return gaps
