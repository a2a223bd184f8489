"""Tracks of one call, each turned into transcript events: the plumbing the telephony and compatibility adapters
share (``/twilio`` and ``/v1/realtime``).

A :class:`Transcriber` owns one :class:`~streamer.core.stream.StreamCore` per named track, each behind a
:class:`~streamer.server.scheduler.DecodeClient` registered with the shared scheduler, and hands every core event to the
adapter's callback together with the track it belongs to. It resamples what the adapter feeds to 16 kHz. Sans-I/O
like the adapters: ``now`` is an argument, and it never awaits or touches a socket.

Use::

    transcriber = Transcriber(scheduler, core_options, "call-42", ("inbound", "outbound"), 8000, on_event)
    transcriber.feed("inbound", samples_8k, now)     # any number of times, per track
    transcriber.finalize("inbound", now)             # optional: commit what was heard so far
    transcriber.end(now)                             # no more audio: the last events follow, then done is true
    transcriber.close()                              # always, once done (or given up on): unregister from the scheduler
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from streamer.core.errors import InvalidState
from streamer.core.events import Event, Final, Lost, NonSpeech
from streamer.core.options import CoreOptions, for_the_model
from streamer.core.speakers import SpeakerOptions
from streamer.core.stream import StreamCore
from streamer.core.units import samples_to_seconds
from streamer.engine import silero_vad
from streamer.engine.types import StreamId
from streamer.server.adapter import FLUSH_GAVE_UP
from streamer.server.lifecycle import StreamLifecycle, StreamLimits
from streamer.server.scheduler import Scheduler
from streamer.server.speaker_worker import SpeakerCoreClient, SpeakerWorker

__all__ = ["EventCallback", "Track", "Transcriber", "TranscribingAdapter"]

logger = logging.getLogger(__name__)

EventCallback = Callable[[str, Event], None]
"""Called with the track name and each core event, in stream order per track, on the event loop thread."""


class Track(SpeakerCoreClient):
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
        speakers: SpeakerWorker | None = None,
        diarize: SpeakerOptions | None = None,
    ) -> None:
        """``diarize``: label each track's speakers with ``speakers``' voice encoder (the caller checked that it
        is available); a failure mid-stream is logged once and the words go on without speakers."""
        if not tracks or len(set(tracks)) != len(tracks):
            raise InvalidState(f"tracks must be distinct and at least one, not {tracks!r}")
        self.scheduler = scheduler
        self.on_event = on_event
        # called after each batch of events was handed to on_event (the cores' state then reflects all of them, and
        # done says whether the last event of every track has come)
        self.after_events = after_events
        self.tracks: dict[str, Track] = {}
        core_options = for_the_model(core_options, scheduler.engine.info.multilingual)
        for name in tracks:
            core = StreamCore(core_options, StreamId(f"{prefix}/{name}"), vad_classifiers=silero_vad.CLASSIFIERS)
            self.tracks[name] = Track(self, name, core, sample_rate)
        self._ending = False
        self._closed = False
        for track in self.tracks.values():
            scheduler.register(track)
        self.speakers = speakers if diarize is not None else None
        if self.speakers is not None and diarize is not None:
            for track in self.tracks.values():
                track.start_diarizing(diarize)
                self.speakers.register(track)
        # why speaker labels stopped, once they did (None: they did not)
        self.diarization_failure: str | None = None

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
            track.receive_audio(samples)
        self.collect()

    def finalize(self, name: str, now: float) -> None:
        """Commit what track ``name`` heard so far, without waiting for a pause (the track goes on)."""
        self.track(name).core.receive_finalize()
        self.collect()

    def end(self, now: float) -> None:
        """No more audio on any track: flush the resamplers and end every core. Idempotent."""
        if self._ending:
            return
        self._ending = True
        for track in self.tracks.values():
            self._feed16k(track, track.resampler.flush(), now)
            track.receive_end_of_stream()
        self.collect()

    @property
    def done(self) -> bool:
        """Whether every track has ended (:meth:`end`) and accounted for all its audio: no event will follow."""
        return self._ending and all(t.core.done and not t.events_held for t in self.tracks.values())

    def collect(self) -> None:
        """Hand every pending core event to the callback and let the scheduler look for work. Called after every
        core call."""
        for track in self.tracks.values():
            for event in track.events():
                if isinstance(event, Final | NonSpeech | Lost):
                    track.accounted = max(track.accounted, event.end)
                self.on_event(track.name, event)
            if track.diarization_failure is not None and self.diarization_failure is None:
                self.diarization_failure = track.diarization_failure
                logger.warning("event=diarization_failed track=%s reason=%r", track.name, self.diarization_failure)
        if self.after_events is not None:
            self.after_events()
        if not self._closed:
            self.scheduler.notify()
            if self.speakers is not None and any(t.wants_embedding for t in self.tracks.values()):
                self.speakers.notify()

    def give_up(self, reason: str) -> None:
        """Stop waiting for the engine: each track's audio no event has accounted for yet becomes one
        :class:`~streamer.core.events.Lost` span, handed to the callback like the engine's own, and the transcriber is
        closed (a result still in flight cannot account for that audio twice). Call when the flush bound expires."""
        self.close()
        for track in self.tracks.values():
            received = track.core.samples_received
            if track.accounted < received:
                lost = Lost(track.accounted, received, reason)
                track.accounted = received
                self.on_event(track.name, lost)

    def close(self) -> None:
        """Unregister every track from the scheduler (idempotent); results still in flight are dropped."""
        if self._closed:
            return
        self._closed = True
        for track in self.tracks.values():
            self.scheduler.unregister(track)
            if self.speakers is not None:
                self.speakers.unregister(track)


class TranscribingAdapter(StreamLifecycle):
    """The stream story (:class:`~streamer.server.lifecycle.StreamLifecycle`) around the :attr:`transcriber` a
    subclass builds once audio comes: ``/twilio``, ``/v1/realtime`` and Deepgram's adapters. The transcriber's tracks
    are the stream's channels: draining ends them, giving up hands what is left over as ``Lost``.

    Subclasses feed the transcriber with ``after_events=self._after_events`` (or call it from theirs), handle a frame
    only while :meth:`_note_frame` returns True, implement :meth:`_idle_error` and :meth:`_finish`, and set
    :attr:`kind`, :attr:`id` and :attr:`_log`.
    """

    def __init__(self, limits: StreamLimits, now: float) -> None:
        super().__init__(limits, now)
        self.transcriber: Transcriber | None = None

    def release(self) -> None:
        """Let go of the scheduler (idempotent)."""
        if self.transcriber is not None:
            self.transcriber.close()

    def _drain(self, now: float) -> None:
        if self.transcriber is not None:
            self.transcriber.end(now)  # its events, and _after_events, may finish the story at once

    def _drained(self) -> bool:
        return self.transcriber is None or self.transcriber.done

    def _give_up(self, now: float) -> None:
        if self.transcriber is not None:
            self.transcriber.give_up(FLUSH_GAVE_UP)

    def _progress(self) -> int:
        if self.transcriber is None:
            return 0
        return sum(t.accounted for t in self.transcriber.tracks.values()) + self.transcriber.scheduler.outcomes

    def _backlog_seconds(self) -> float:
        if self.transcriber is None:
            return 0.0
        tracks = self.transcriber.tracks.values()
        return samples_to_seconds(sum(t.core.samples_received - t.accounted for t in tracks))

    def _after_events(self) -> None:
        self._finish_if_drained()
