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

from abc import abstractmethod
from collections.abc import Callable, Sequence
from enum import Enum

import numpy as np
import numpy.typing as npt

from streamer.core.errors import IdleTimeout, InvalidState, ProtocolError, ServerShutdown
from streamer.core.events import Event, Final, Lost, NonSpeech
from streamer.core.options import CoreOptions, for_the_model
from streamer.core.stream import StreamCore
from streamer.core.units import samples_to_seconds
from streamer.engine import silero_vad
from streamer.engine.types import StreamId
from streamer.server.adapter import FLUSH_GAVE_UP, Adapter, FlushBound, SessionLog
from streamer.server.scheduler import CoreClient, Scheduler

__all__ = ["EventCallback", "Phase", "Track", "Transcriber", "TranscribingAdapter"]

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
            track.core.receive_audio(samples)
            track.offered = True
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
            track.core.receive_end_of_stream()
        self.collect()

    @property
    def done(self) -> bool:
        """Whether every track has ended (:meth:`end`) and accounted for all its audio: no event will follow."""
        return self._ending and all(t.core.done for t in self.tracks.values())

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
        if not self._closed:
            self.scheduler.notify()

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


class Phase(Enum):
    """Where a :class:`TranscribingAdapter` is in its story."""

    RECEIVING = "receiving"  # frames flow until the client ends the stream, an error, idleness or shutdown
    DRAINING = "draining"  # no more audio; the cores finish the last events while they make progress (FlushBound)
    CLOSED = "closed"  # the last word is said; the close is decided


class TranscribingAdapter(Adapter):
    """The story the ``/twilio`` and ``/v1/realtime`` adapters share (:mod:`streamer.server.adapter`), around the
    :attr:`transcriber` a subclass builds once audio comes: frames until :meth:`_end`, which may come from a frame,
    the idle timeout (no frame for ``idle_timeout`` seconds) or shutdown; then the last events of every track, for as
    long as the engine makes progress (:class:`~streamer.server.adapter.FlushBound`: ``flush_timeout`` seconds
    without any gives up, and what is left is handed over as ``Lost``); then :meth:`_finish`, the subclass's last
    word and close.

    Subclasses feed the transcriber with ``after_events=self._after_events`` (or call it from theirs), note each
    frame with ``self._last_frame = now`` while :attr:`phase` is ``RECEIVING``, implement :meth:`_idle_error`
    and :meth:`_finish`, and set :attr:`kind`, :attr:`id` and :attr:`_log` (the flush's give-up is logged).
    """

    # the endpoint, as the log names it ("twilio=<id> event=..."); subclasses set it, and :attr:`id` and :attr:`_log`
    kind = "stream"
    id: str
    _log: SessionLog

    def __init__(self, idle_timeout: float, flush_timeout: float, now: float) -> None:
        super().__init__()
        self.phase = Phase.RECEIVING
        self.transcriber: Transcriber | None = None
        self.idle_timeout = idle_timeout
        self.flush_timeout = flush_timeout
        self._last_frame = now
        # why the stream ended (None: the client ended it), and how long its last events may take
        self._error: ProtocolError | None = None
        self._flush = FlushBound(flush_timeout)

    @abstractmethod
    def _idle_error(self) -> IdleTimeout:
        """What a stream idle for ``idle_timeout`` seconds is told."""

    @abstractmethod
    def _finish(self) -> None:
        """The last events are in (or the flush bound gave up): say the last word, set :attr:`phase` to ``CLOSED`` and
        decide the close."""

    def receive_timer(self, now: float) -> None:
        if self.phase is Phase.RECEIVING and now >= self._last_frame + self.idle_timeout:
            self._end(self._idle_error(), now)
        elif self.phase is Phase.DRAINING and self._flush.expired(now, self._progress()):
            if self.transcriber is not None:  # what the engine did not finish is named, as the engine's failures are
                self._log.warning(
                    "%s=%s event=flush_timeout waited_s=%.1f extensions=%d lost_s=%.2f",
                    self.kind,
                    self.id,
                    now - self._flush.ended,
                    self._flush.extensions,
                    self._backlog_seconds(),
                )
                self.transcriber.give_up(FLUSH_GAVE_UP)
            self._finish()

    def receive_shutdown(self, now: float) -> None:
        """The server is stopping: the last events (for at most ``flush_timeout`` from now, progress or not), then the
        subclass's close (1001)."""
        self._end(ServerShutdown("the server is shutting down"), now)
        self._flush.cap(now + self.flush_timeout)  # a flush under way already is capped too

    @property
    def reading(self) -> bool:
        return self.phase is Phase.RECEIVING

    def next_deadline(self) -> float | None:
        if self.phase is Phase.RECEIVING:
            return self._last_frame + self.idle_timeout
        if self.phase is Phase.DRAINING:
            return self._flush.deadline
        return None

    def release(self) -> None:
        """Let go of the scheduler (idempotent)."""
        if self.transcriber is not None:
            self.transcriber.close()

    def _end(self, error: ProtocolError | None, now: float) -> None:
        """No more audio: the last events of every track, then :meth:`_finish`."""
        if self.phase is not Phase.RECEIVING:
            return
        self._error = error
        self.phase = Phase.DRAINING
        self._flush.start(now, self._progress(), self._backlog_seconds())
        if self.transcriber is None:
            self._finish()
        else:
            self.transcriber.end(now)  # its events, and _after_events, may finish the story at once

    def _progress(self) -> int:
        """What the flush bound watches: samples the transcriber's events have accounted for, over every track, and
        the engine's outcomes."""
        if self.transcriber is None:
            return 0
        return sum(t.accounted for t in self.transcriber.tracks.values()) + self.transcriber.scheduler.outcomes

    def _backlog_seconds(self) -> float:
        """Seconds of audio, over every track, that no event has accounted for yet."""
        if self.transcriber is None:
            return 0.0
        tracks = self.transcriber.tracks.values()
        return samples_to_seconds(sum(t.core.samples_received - t.accounted for t in tracks))

    def _after_events(self) -> None:
        if self.phase is Phase.DRAINING and self.transcriber is not None and self.transcriber.done:
            self._finish()
