"""One ``/v1/listen`` stream: the endpoint's sans-I/O adapter (:mod:`streamer.server.adapter`) between frames, the
stream cores and the scheduler.

The session decides nothing about transcription. Its frames go through the stream's audio input
(:mod:`streamer.server.audio_input`: raw samples, or WebM, Ogg and WAV files), each channel is resampled to 16 kHz
and fed to its own :class:`~streamer.core.stream.StreamCore` (:mod:`streamer.server.listen_channel`) with the ``now``
the connection runner (:mod:`streamer.server.runner`) passes in, the :class:`~streamer.server.scheduler.Scheduler`
runs the windows the cores ask for, and core events become protocol messages in a bounded send buffer
(:mod:`streamer.server.listen_transcripts`, :class:`~streamer.server.outbox.Outbox`). Its story is every stream's
(:mod:`streamer.server.lifecycle`); parking a dropped connection for a resume, and being taken over by another
replica, are its own (:mod:`streamer.server.takeover`).

Accounting: each core reports every accepted sample in exactly one :class:`~streamer.core.events.Final`,
:class:`~streamer.core.events.NonSpeech` or :class:`~streamer.core.events.Lost`; the session forwards them all (a
``Lost`` as an ``error`` naming its range) and sums them in ``done``. Audio the cores could not finish before the
session had to close is reported the same way, as ``error`` messages with ``lost`` ranges.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from streamer.core.container import Samples
from streamer.core.errors import (
    EngineFailure,
    IdleTimeout,
    InternalError,
    InvalidState,
    ProtocolError,
    ServerShutdown,
    SlowReader,
    UnknownSession,
)
from streamer.core.events import Event, Final, Lost, NonSpeech, Partial, SpeechEnded, SpeechStarted
from streamer.core.options import CoreOptions, for_the_model
from streamer.core.stream import StreamCore
from streamer.core.units import SAMPLE_RATE, samples_to_seconds
from streamer.engine import silero_vad
from streamer.engine.types import StreamId
from streamer.server.adapter import FLUSH_GAVE_UP, LOST, Close, SendLimits, session_log
from streamer.server.arrivals import ArrivalLog
from streamer.server.audio_input import check_frame_size, open_audio_input
from streamer.server.client_messages import Configure, End, Finalize, parse_client_message
from streamer.server.lifecycle import Phase, StreamLifecycle, StreamLimits
from streamer.server.listen_channel import ListenChannel
from streamer.server.listen_query import ListenParams
from streamer.server.listen_speakers import ListenSpeakers
from streamer.server.listen_transcripts import (
    Outgoing,
    QueuedSummary,
    QueuedTranscript,
    TranscriptRenderer,
    partial_channel,
    ready_message,
    seconds,
)
from streamer.server.metrics import ServerMetrics
from streamer.server.outbox import Outbox
from streamer.server.ratelimit import AudioRateLimiter
from streamer.server.resume import KeptFinal, ResumeRegistry, SessionRecord, SessionStore
from streamer.server.scheduler import Scheduler
from streamer.server.server_messages import (
    ErrorMessage,
    LostRange,
    Ready,
    ResumeHint,
    SpeechEndedMessage,
    SpeechStartedMessage,
    serialize,
)
from streamer.server.session_options import SessionId, SessionOptions, new_session_id
from streamer.server.speaker_worker import SpeakerWorker
from streamer.server.status import SessionSnapshot

if TYPE_CHECKING:
    from streamer.server.takeover import Takeover

__all__ = ["Session"]

logger = logging.getLogger(__name__)

# the arrival log is cut back every this many frames (a few seconds of 100 ms frames), keeping what any transcript
# still to be made may need, and a window's length (30 s) more for safety
_ARRIVALS_PRUNE_EVERY = 64
_ARRIVALS_MARGIN = 30 * SAMPLE_RATE


def _nothing() -> None:
    return None


class Session(StreamLifecycle):
    """One ``/v1/listen`` stream, sans-I/O (:mod:`streamer.server.adapter`), from the ``ready`` it says on construction
    to its close; :func:`open_listen_session` makes one, or claims a parked one back with :meth:`resume`.

    The story: 1-2 (construction) the request's parameters, one core per channel, ``ready``; 3 frames until ``end``,
    an error, a lost connection or shutdown; 4 a dropped connection parks the session (see the module docstring);
    5 otherwise every final the cores can still produce, while they make progress (``flush_timeout``, FlushBound);
    6 ``done`` or the error, and the close code that goes with it; 7 the cores let go of (:meth:`release`, unless
    parked). Steps 3, 5 and 6 are every stream's (:class:`~streamer.server.lifecycle.StreamLifecycle`); parking and
    resuming are this endpoint's own.
    """

    kind = "session"

    def __init__(
        self,
        params: ListenParams,
        scheduler: Scheduler,
        core_options: CoreOptions,
        options: SessionOptions,
        model: str,
        now: float,
        metrics: ServerMetrics | None = None,
        registry: ResumeRegistry | None = None,
        store: SessionStore | None = None,
        takeover: Takeover | None = None,
        speakers: SpeakerWorker | None = None,
    ) -> None:
        super().__init__(StreamLimits(options.idle_timeout, options.flush_timeout, options.max_session_seconds), now)
        self.id = new_session_id() if takeover is None else SessionId(takeover.record.session_id)
        self._log = session_log(logger, self.id)
        self.scheduler = scheduler
        self.core_options = core_options
        self.options = options
        self.send_limits = SendLimits(
            send_timeout=options.slow_reader_seconds,
            flush_timeout=options.flush_timeout,
            socket_send_buffer=options.socket_send_buffer,
        )
        self.model = model
        self.metrics = metrics if metrics is not None else scheduler.metrics
        self.registry = registry
        # where the session keeps its record for other replicas (streamer.server.resume); None: nowhere
        self.store = store
        self.channels: list[ListenChannel] = []
        self.speakers = ListenSpeakers(speakers, self.channels, self._log)  # labels, with diarize=true
        self._params = params
        self._limiter = AudioRateLimiter(options.rate_limit, now)
        # raw samples, or a file's bytes (encoding=opus or container), one row per channel to _feed_samples
        raw_format = None if params.container is not None else params.audio_format
        self._input = open_audio_input(
            raw_format,
            params.container,
            params.channels,
            options.rate_limit,
            self._limiter,
            self._feed_samples,
        )
        self._outbox = Outbox(options.send_buffer, partial_channel)
        # when audio arrived (16 kHz samples per channel): the clock of every transcript's latency_ms
        self._arrivals = ArrivalLog()
        self._renderer = TranscriptRenderer(self.metrics)
        # the newest finals, kept for a resuming client; every final up to _forgotten_seq was dropped from it
        self.finals: deque[QueuedTranscript] = deque()
        self._seq = 0
        self._forgotten_seq = 0
        # lost-audio errors that found no connection to go out on; the next connection gets them first
        self._undelivered: list[ErrorMessage] = []
        # the close of the last word, until it is logged; and whether the cores are let go of
        self._said: Close | None = None
        self._unregistered = False
        # the channels' positions (accounted, context start) as of the last record saved
        self._saved: list[tuple[int, int]] = []
        # 2. One core per channel, each registered with the scheduler; then tell the client we are ready.
        core_options = self.core_options
        if params.language is not None:
            core_options = replace(core_options, decode=replace(core_options.decode, language=params.language))
        if params.prompt or params.keywords:
            decode = replace(core_options.decode, initial_prompt=params.prompt, keywords=params.keywords)
            core_options = replace(core_options, decode=decode)
        core_options = for_the_model(core_options, scheduler.engine.info.multilingual)
        vad_classifiers = silero_vad.CLASSIFIERS  # --vad silero's model, which the core cannot import
        for index in range(params.channels):
            stream_id = StreamId(f"{self.id}/{index}")
            if takeover is None:
                core = StreamCore(core_options, stream_id, vad_classifiers=vad_classifiers)
                self.channels.append(ListenChannel(self.after_core_update, index, core, params.sample_rate))
                continue
            # a session taken over: each core starts where the record's accounting of its channel ends
            core = StreamCore(core_options, stream_id, takeover.origin(index), vad_classifiers=vad_classifiers)
            taken, skip = takeover.record.channels[index], takeover.skip(index)
            self.channels.append(ListenChannel(self.after_core_update, index, core, params.sample_rate, taken, skip))
        for channel in self.channels:
            self.scheduler.register(channel)
        if params.diarize:
            self.speakers.start(params.max_speakers)
        if takeover is None:
            self._put(self._ready(resumed=False))
        else:
            self._take_over(takeover)
        opened, audio = "open" if takeover is None else "taken_over", (params.encoding.value, params.sample_rate)
        self._log.info(
            "session=%s event=%s encoding=%s sample_rate=%d channels=%d language=%s diarize=%s",
            *(self.id, opened, *audio, params.channels, params.language, params.diarize),
        )
        self._save()

    def _take_over(self, takeover: Takeover) -> None:
        """2b. The session goes on from its record: its seq, the finals after ``last_seq`` (kept until the next resume
        acknowledges them), and ``ready`` saying from which frame the client resends its audio."""
        record = takeover.record
        self.owner = record.owner  # a resumed session keeps its owner, whoever resumes it (an admin may)
        self._seq = self._forgotten_seq = record.seq
        self._input.start_at(takeover.resume_sample / SAMPLE_RATE)  # the client's resume_frame, on its clock
        for kept in record.finals:
            if kept.seq > takeover.last_seq:
                self.finals.append(QueuedTranscript(kept.channel, kept.final, kept.seq))
        if self.finals:
            self._forgotten_seq = self.finals[0].seq - 1
        self._put(self._ready(resumed=True))
        for final in self.finals:
            self._put(final)
        self._log.info(
            "session=%s event=taken_over last_seq=%d replayed=%d resume_from=%.3f accounted=%.3f",
            self.id,
            takeover.last_seq,
            len(self.finals),
            takeover.resume_frame / self._params.sample_rate,
            samples_to_seconds(min(c.accounted for c in record.channels)),
        )

    def record(self) -> SessionRecord:
        """The session as of now, for another replica to take it over (:mod:`streamer.server.resume`)."""
        finals = tuple(KeptFinal(t.seq, t.channel, t.event) for t in self.finals if isinstance(t.event, Final))
        return SessionRecord(
            session_id=self.id,
            owner=self.owner,
            query=self._params.to_query(),
            seq=self._seq,
            channels=tuple(c.record() for c in self.channels),
            finals=finals,
        )

    def _save(self) -> None:
        """The record changed: the store writes it soon (never waiting; see streamer.server.redis_link)."""
        self._saved = self._positions()
        if self.store is not None and self.options.resume_grace_seconds > 0 and self.registry is not None:
            self.store.save(self)

    def resume(self, last_seq: int, now: float) -> None:
        """Attach a new connection to this parked session (the registry's :meth:`~ResumeRegistry.claim` returned
        it): ``ready`` with ``resumed: true``, the finals after ``last_seq``, the lost-audio errors that found no
        connection, then the live stream, served like a new session's."""
        if self.phase is not Phase.PARKED:
            raise InvalidState(f"only a parked session can be resumed, not a {self.phase.value} one")
        self._close = None
        self._outbox = Outbox(self.options.send_buffer, partial_channel)
        self._last_frame = now
        # a sample cut in half by the drop is not audio (the client resends from a frame); a container's new
        # connection starts a new file (a recorder restarted)
        self._input.restart(now)
        # the client has every final up to last_seq: forget them, and send it the rest before anything new
        while self.finals and self.finals[0].seq <= last_seq:
            self._forgotten_seq = self.finals.popleft().seq
        self.phase = Phase.RECEIVING
        self._put(self._ready(resumed=True))
        for final in self.finals:
            self._put(final)
        for error in self._undelivered:
            self._put(error)
        self._undelivered.clear()
        self._log.info("session=%s event=resumed last_seq=%d replayed=%d", self.id, last_seq, len(self.finals))

    # -- inputs: 3. frames until the client ends the stream, breaks a rule, goes away, or the server stops us ----

    def receive_bytes(self, frame: bytes, now: float) -> None:
        self._receive(frame, now)

    def receive_text(self, frame: str, now: float) -> None:
        self._receive(frame, now)

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        """Mid-stream, a dropped connection parks the session (4); one the client closed ends it without a flush.
        Once the stream has ended, the flush goes on (its finals count) and nothing more is sent."""
        if self.phase is not Phase.RECEIVING:
            return
        # 4. Gone mid-stream: park, keeping the cores working and every final, for a resuming client.
        if dropped and self._park():
            self._close_with(LOST.code, LOST.reason)
            return
        self._log.info("session=%s event=gone", self.id)
        self._close_with(LOST.code, LOST.reason)
        self.release()

    def receive_send_timeout(self, now: float) -> None:
        self._log.warning("session=%s event=slow_reader unsent=%d", self.id, len(self._outbox.items))
        self._end(SlowReader(f"the client did not read for {self.options.slow_reader_seconds:g} s"), now)

    # -- outputs ----------------------------------------------------------------------------------------------------

    def messages_to_send(self, now: float, limit: int | None = None) -> list[str]:
        """Queued messages, oldest first; each transcript's latency is measured now, as it goes out."""
        items = self._outbox.items
        count = len(items) if limit is None else min(limit, len(items))
        return [serialize(self._renderer.render(items.popleft(), now, self.channels)) for _ in range(count)]

    def release(self) -> None:
        """7. Let go of the cores and the scheduler, unless the session is parked (then :meth:`expire` does). The
        runner calls it as the connection's run ends: after the last word, the close has been sent by then."""
        if self.phase is Phase.PARKED:
            return
        if self._said is not None:
            self._log.info(
                "session=%s event=closed code=%s received_s=%.2f dropped_partials=%d",
                self.id,
                self._said.code,
                sum(samples_to_seconds(c.core.samples_received) for c in self.channels),
                self._outbox.dropped_partials,
            )
            self._said = None
        self._unregister()

    def _unregister(self) -> None:
        """The session is over: no more audio, events or resumes. Idempotent."""
        self.phase = Phase.CLOSED
        if not self._unregistered:
            self._unregistered = True
            for channel in self.channels:
                self.scheduler.unregister(channel)
            self.speakers.close()
            if self.store is not None:
                self.store.drop(self.id)

    # -- the story --------------------------------------------------------------------------------------------------

    def _receive(self, frame: str | bytes, now: float) -> None:
        if not self._note_frame(now):
            return
        try:
            if isinstance(frame, bytes):
                self._receive_audio(frame, now)
            else:
                message = parse_client_message(frame)
                if isinstance(message, End):
                    self._end(None, now)
                    return
                if isinstance(message, Finalize):
                    for channel in self.channels:
                        channel.core.receive_finalize()
                if isinstance(message, Configure):
                    self._configure(message)
            self.after_core_update()
        except ProtocolError as error:
            self._end(error, now)
        except Exception:
            self._log.exception("session=%s event=internal_error", self.id)
            self._end(InternalError("internal server error"), now)

    def _configure(self, message: Configure) -> None:
        """A ``configure``: the prompt and keywords it gives (a field left out keeps its value) apply to every
        channel's windows from the next one on. parse_client_message checked their bounds."""
        params = self._params
        prompt = params.prompt if message.prompt is None else message.prompt
        keywords = params.keywords if message.keywords is None else message.keywords
        params, released = self.speakers.configure(params, message)  # diarize and max_speakers
        for channel, event in released:
            self._forward(channel, event)
        for channel in self.channels:
            channel.core.receive_configure(prompt, keywords)
        # the query a replica taking the session over rebuilds it from (SessionRecord.query) carries them too
        self._params = replace(params, prompt=prompt, keywords=keywords)
        self._save()
        self._log.info("session=%s event=configure prompt_chars=%d keywords=%d", self.id, len(prompt), len(keywords))

    def _end(self, error: ProtocolError | None, now: float) -> None:
        """The stream ends: 5. flush (unless the reader is too slow for it to matter), then 6. the last word."""
        if self.phase is Phase.RECEIVING and isinstance(error, SlowReader):
            self._error = error
            self._finish()  # nothing queued can reach this reader in time, nor could the flush's finals
            return
        super()._end(error, now)

    def _drain(self, now: float) -> None:
        """5. Whatever the reason, flush: every final the cores can still produce goes out before the close."""
        # 5. The input's last samples, and the error if a container was cut short (after any error that ended it).
        cut_short = self._input.end(now)
        if cut_short is not None:
            self._log.info(
                "session=%s event=container_error code=%s reason=%r", self.id, cut_short.code, cut_short.message
            )
            self._error = self._error or cut_short
        for channel in self.channels:
            self._feed(channel, channel.resampler.flush(), now)
            channel.receive_end_of_stream()
        self.after_core_update()  # the last word may be said at once

    def _drained(self) -> bool:
        return all(c.core.done and not c.events_held for c in self.channels)

    def _give_up(self, now: float) -> None:
        """The flush bound ran out: every gap in each channel's accounting is named lost."""
        for channel in self.channels:
            for start, end in channel.gaps():
                with contextlib.suppress(SlowReader):
                    self._report_lost(channel, start, end, FLUSH_GAVE_UP)

    def _idle_error(self) -> IdleTimeout:
        return IdleTimeout(f"no audio or keepalive for {self.limits.idle_timeout:g} s")

    def _backlog_seconds(self) -> float:
        return samples_to_seconds(sum(c.core.samples_received - c.accounted for c in self.channels))

    def _finish(self) -> None:
        """6. ``done`` after a clean end, else the error; then the close code that goes with it."""
        error = self._error
        last: Outgoing = QueuedSummary()
        if error is not None:
            hint = ResumeHint(self.id, self._seq) if isinstance(error, ServerShutdown) else None
            last = ErrorMessage(code=error.code, message=error.message, resume=hint)
        if isinstance(error, SlowReader):
            self._outbox.items.clear()  # nothing queued can reach this reader in time; say why instead
        try:
            self._outbox.put(last)
        except SlowReader as slow:  # the last word does not fit either: the reader is too slow for it to matter
            error = self._error = slow
            self._outbox.items.clear()
            self._outbox.put(ErrorMessage(code=slow.code, message=slow.message))
        if error is None:
            self._close_with(1000, "done")
        else:
            self._close_with(error.close_code, error.code)
        self._said = self.close_action()  # logged once the runner has sent it (release)
        self._unregister()  # the cores have said all they will

    def _ready(self, resumed: bool) -> Ready:
        return ready_message(self.id, self.model, self._params, self._input.seconds, resumed)

    def _park(self) -> bool:
        """The connection dropped mid-stream: wait in the registry for a resume. False when resume is off."""
        if self.registry is None or self.options.resume_grace_seconds <= 0:
            return False
        self.phase = Phase.PARKED
        # a parked session holds no admission slot (the runner releases the connection's when its run ends), or
        # dropped connections could fill the server (the registry keeps at most max_sessions of them); a resume
        # takes a slot again, as every connection does
        # lost-audio errors still queued never went out: keep them for the next connection (finals are in .finals)
        self._undelivered.extend(
            item for item in self._outbox.items if isinstance(item, ErrorMessage) and item.lost is not None
        )
        self._outbox.items.clear()
        self.wakeup = _nothing  # the connection's runner is gone; the next one sets its own
        self.registry.park(self, self.options.resume_grace_seconds, limit=self.scheduler.options.max_sessions)
        self._save()  # the record's time to live starts again: the grace period
        return True

    def check_resume(self, last_seq: int) -> None:
        """Raise :class:`~streamer.core.errors.UnknownSession` unless every final after ``last_seq`` is still kept."""
        if not self._forgotten_seq <= last_seq <= self._seq:
            raise UnknownSession(
                f"cannot resume from last_seq {last_seq}: this session keeps finals {self._forgotten_seq + 1} "
                f"to {self._seq}"
            )

    def expire(self) -> None:
        """Nobody resumed the parked session in time (or the server stops): let go of everything."""
        if self.phase is not Phase.PARKED:
            return
        self._log.info("session=%s event=expired unacknowledged_finals=%d", self.id, len(self.finals))
        self._unregister()

    def snapshot(self, now: float) -> SessionSnapshot:
        """The session as ``GET /status`` shows it, as of ``now`` (``time.monotonic()``)."""

        received = sum(c.core.samples_received for c in self.channels)
        accounted = sum(c.transcribed + c.non_speech + c.lost for c in self.channels)
        return SessionSnapshot(
            id=self.id,
            kind="listen",
            age_seconds=round(now - self._opened, 3),
            channels=len(self.channels),
            audio_seconds=_total(received),
            lag_seconds=_total(sum(c.core.backlog_samples for c in self.channels)),
            uncommitted_seconds=_total(received - accounted),
            partial_latency_ms=self._renderer.summary("partial"),
            final_latency_ms=self._renderer.summary("final"),
        )

    # -- audio ------------------------------------------------------------------------------------------------------

    def _receive_audio(self, frame: bytes, now: float) -> None:
        check_frame_size(frame, self.options.max_frame_bytes)
        self._input.receive(frame, now)

    def _feed_samples(self, samples: Samples, now: float) -> None:
        """Decoded audio, one row per channel at the source rate: each channel's resampler follows it (a container's
        rate is known once its header is in)."""
        for channel, mono in zip(self.channels, samples.audio, strict=True):
            for resampled in channel.resample(mono, samples.sample_rate):
                self._feed(channel, resampled, now)

    def _feed(self, channel: ListenChannel, samples: npt.NDArray[np.float32], now: float) -> None:
        fed = channel.feed(samples)
        if not fed:
            return
        self.metrics.audio_received.inc(samples_to_seconds(fed))
        if channel.index == 0:
            # every channel gets the same number of samples, so channel 0's count dates them all
            self._arrivals.record(channel.core.samples_received, now)
            if len(self._arrivals) % _ARRIVALS_PRUNE_EVERY == 0:
                self._arrivals.forget_before(self._oldest_audio_end())

    # -- core events ------------------------------------------------------------------------------------------------

    def after_core_update(self) -> None:
        """Collect what the cores have to say, queue it for sending, and let the scheduler look for work.
        Call after every core call (the channels call it after decode results)."""
        try:
            for channel in self.channels:
                for event in channel.events():
                    self._forward(channel, event)
            notice = self.speakers.after_events()  # and the encoder woken for their windows
            if notice is not None:
                self._put(notice)
            if self._positions() != self._saved:
                self._save()
        except SlowReader as error:
            if self.phase is Phase.DRAINING:
                self._error = error
                self._finish()
            else:
                self._end(error, self._last_frame)
        self._finish_if_drained()
        self.scheduler.notify()
        self.wakeup()

    def _progress(self) -> int:
        """What the flush bound watches: samples accounted for, over every channel, and the engine's outcomes."""
        return sum(c.accounted for c in self.channels) + self.scheduler.outcomes

    def _positions(self) -> list[tuple[int, int]]:
        return [c.position() for c in self.channels]

    def _forward(self, channel: ListenChannel, event: Event) -> None:
        if isinstance(event, SpeechStarted):
            self._put(SpeechStartedMessage(channel=channel.index, start=seconds(event.start)))
        elif isinstance(event, SpeechEnded):
            self._put(
                SpeechEndedMessage(
                    channel=channel.index,
                    start=seconds(event.start),
                    end=seconds(event.end),
                    reason=event.reason.value,
                )
            )
        elif isinstance(event, Partial):
            self._put(QueuedTranscript(channel.index, event, arrived=self._arrivals.arrival_of(event.audio_end)))
        elif isinstance(event, Final):
            channel.transcribed += event.end - event.start
            channel.account(event.start, event.end)
            self.metrics.audio_transcribed.inc(samples_to_seconds(event.end - event.start))
            self._seq += 1
            transcript = QueuedTranscript(channel.index, event, self._seq, self._arrivals.arrival_of(event.audio_end))
            if self.registry is not None and self.options.resume_grace_seconds > 0:
                self.finals.append(transcript)  # until a resume acknowledges it, or it is one too many to keep
                if len(self.finals) > self.options.resume_finals:
                    self._forgotten_seq = self.finals.popleft().seq
            self._put(transcript)
        elif isinstance(event, NonSpeech):
            channel.non_speech += event.end - event.start
            channel.account(event.start, event.end)
        elif isinstance(event, Lost):
            self._report_lost(channel, event.start, event.end, "the engine failed on this audio; it is lost")

    def _report_lost(self, channel: ListenChannel, start: int, end: int, message: str) -> None:
        channel.lost += end - start
        channel.account(start, end)
        lost = LostRange(start=seconds(start), end=seconds(end))
        self._put(ErrorMessage(code=EngineFailure.code, message=message, lost=lost, channel=channel.index))

    def _put(self, item: Outgoing) -> None:
        if self.phase is Phase.PARKED:
            # no connection: finals wait in self.finals, lost-audio errors here; partials and speech_* would
            # be stale by the time a client resumes
            if isinstance(item, ErrorMessage) and item.lost is not None:
                self._undelivered.append(item)
            return
        if self.close_action() is not None:
            return  # the last word is said
        self._outbox.put(item)

    def _oldest_audio_end(self) -> int:
        """A lower bound of the ``audio_end`` of every transcript still to be made: the windows still to decode end
        after their channel's buffered audio starts (made transcripts carry their arrival time)."""
        return min((c.core.buffer_start for c in self.channels), default=0) - _ARRIVALS_MARGIN


def _total(samples: int) -> float:
    return round(samples_to_seconds(samples), 3)
