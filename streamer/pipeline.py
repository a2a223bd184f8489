"""Tracks of one call, each turned into transcript events: the plumbing the telephony and compatibility adapters
share (``/twilio`` and ``/v1/realtime``).

A :class:`Transcriber` owns one :class:`~streamer.core.StreamCore` per named track, each behind a
:class:`~streamer.scheduler.DecodeClient` registered with the shared scheduler, and hands every core event to the
adapter's callback together with the track it belongs to. It resamples what the adapter feeds to 16 kHz. The
adapter reads the clock and passes ``now``; the transcriber never touches a socket.

Use::

    transcriber = Transcriber(scheduler, core_options, "call-42", ("inbound", "outbound"), 8000, on_event)
    transcriber.feed("inbound", samples_8k, now)     # any number of times, per track
    transcriber.finalize("inbound", now)             # optional: commit what was heard so far
    await transcriber.drain(timeout)                 # end every track, wait for the last events
    transcriber.close()                              # always, in a finally: unregister from the scheduler
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from streamer.core import CoreOptions, StreamCore
from streamer.engine.types import StreamId
from streamer.errors import InvalidState
from streamer.events import Event, Final, Lost, NonSpeech
from streamer.scheduler import CoreClient, Scheduler

__all__ = ["EventCallback", "Track", "Transcriber"]

EventCallback = Callable[[str, Event], None]
"""Called with the track name and each core event, in stream order per track, on the event loop thread."""


class Track(CoreClient):
    """One track: its core (with its resampler) and how far its events have accounted for the audio."""

    def __init__(self, owner: Transcriber, name: str, core: StreamCore, sample_rate: int) -> None:
        super().__init__(core, sample_rate, owner.collect)
        self.owner = owner
        self.name = name
        # end of the last Final, NonSpeech or Lost span: these tile the stream in order, so everything before this
        # sample has reached its last event
        self.accounted = 0


class Transcriber:
    """See the module docstring. Construct on the event loop; ``on_event`` and ``after_events`` must not raise."""

    def __init__(
        self,
        scheduler: Scheduler,
        core_options: CoreOptions,
        prefix: str,
        tracks: Sequence[str],
        sample_rate: int,
        on_event: EventCallback,
        after_events: Callable[[], None] | None = None,
    ) -> None:
        if not tracks or len(set(tracks)) != len(tracks):
            raise InvalidState(f"tracks must be distinct and at least one, not {tracks!r}")
        self.scheduler = scheduler
        self.on_event = on_event
        # called after each batch of events was handed to on_event (the cores' state then reflects all of them)
        self.after_events = after_events
        self.tracks: dict[str, Track] = {}
        for name in tracks:
            core = StreamCore(core_options, StreamId(f"{prefix}/{name}"))
            self.tracks[name] = Track(self, name, core, sample_rate)
        self._done = asyncio.Event()
        self._ending = False
        self._closed = False
        for track in self.tracks.values():
            scheduler.register(track)

    def track(self, name: str) -> Track:
        try:
            return self.tracks[name]
        except KeyError:
            raise InvalidState(f"no track {name!r}; tracks are {', '.join(self.tracks)}") from None

    def feed(self, name: str, samples: npt.ArrayLike, now: float) -> int:
        """Give track ``name`` its next samples at the source rate; returns how many 16 kHz samples reached the
        core (the resampler holds back a few milliseconds)."""
        track = self.track(name)
        resampled = track.resampler.process(np.asarray(samples, dtype=np.float32))
        self._feed16k(track, resampled, now)
        return len(resampled)

    def _feed16k(self, track: Track, samples: npt.NDArray[np.float32], now: float) -> None:
        if len(samples):
            track.core.receive_audio(samples, now)
            track.offered = True
        self.collect()

    def finalize(self, name: str, now: float) -> None:
        """Commit what track ``name`` heard so far, without waiting for a pause (the track goes on)."""
        self.track(name).core.receive_finalize(now)
        self.collect()

    def end(self, now: float) -> None:
        """No more audio on any track: flush the resamplers and end every core. Idempotent."""
        if self._ending:
            return
        self._ending = True
        for track in self.tracks.values():
            self._feed16k(track, track.resampler.flush(), now)
            track.core.receive_end_of_stream(now)
        self.collect()

    @property
    def done(self) -> bool:
        """Whether every track has ended (:meth:`end`) and accounted for all its audio: no event will follow."""
        return self._ending and all(t.core.done for t in self.tracks.values())

    async def drain(self, timeout: float) -> bool:
        """End every track and wait until each has accounted for all its audio; False if ``timeout`` ran out."""
        self.end(time.monotonic())
        try:
            async with asyncio.timeout(timeout):
                await self._done.wait()
        except TimeoutError:
            return False
        return True

    def collect(self) -> None:
        """Hand every pending core event to the callback and let the scheduler look for work. Called after every
        core call."""
        for track in self.tracks.values():
            for event in track.core.events_received():
                if isinstance(event, Final | NonSpeech | Lost):
                    track.accounted = max(track.accounted, event.end)
                self.on_event(track.name, event)
        if self.after_events is not None:
            self.after_events()
        if self.done:
            self._done.set()
        if not self._closed:
            self.scheduler.notify()

    def close(self) -> None:
        """Unregister every track from the scheduler (idempotent); results still in flight are dropped."""
        if self._closed:
            return
        self._closed = True
        for track in self.tracks.values():
            self.scheduler.unregister(track)
