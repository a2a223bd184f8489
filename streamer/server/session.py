"""One ``/v1/listen`` stream: the endpoint's sans-I/O adapter (:mod:`streamer.server.adapter`) between frames, the
stream cores and the scheduler.

The session decides nothing about transcription. It decodes binary frames (:class:`~streamer.core.audio.WireDecoder`
for raw samples, :class:`~streamer.core.container.ContainerDecoder` for WebM, Ogg and WAV), resamples each channel to
16 kHz, feeds one :class:`~streamer.core.stream.StreamCore` per channel with the ``now`` the
connection runner (:mod:`streamer.server.runner`) passes in, lets the :class:`~streamer.server.scheduler.Scheduler` run
the windows the cores ask for, and turns core events into protocol messages. It also enforces the limits: frame size,
idle timeout and session length (its deadlines), and a bounded send buffer (:class:`_Outbox`) where a newer partial
replaces a stale one while the client is slow to read, and from which the runner takes one message at a time.

Resume: when the connection drops mid-stream, the session parks itself in the server's
:class:`~streamer.server.resume.ResumeRegistry` for ``resume_grace_seconds`` instead of ending. Its cores stay
registered with the scheduler, finals keep their ``seq`` and stay in :attr:`Session.finals` (the last ``resume_finals``
of them), and a connection that comes back with ``?resume=<id>&last_seq=<n>`` (:func:`open_listen_session`) is
attached to the same session: ``ready`` with ``resumed: true``, every final after ``n``, then the stream goes on
where it was.

Accounting: each core reports every accepted sample in exactly one :class:`~streamer.core.events.Final`,
:class:`~streamer.core.events.NonSpeech` or :class:`~streamer.core.events.Lost`; the session forwards them all (a
``Lost`` as an ``error`` naming its range) and sums them in ``done``. Audio the cores could not finish before the
session had to close is reported the same way, as ``error`` messages with ``lost`` ranges.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
from collections import deque
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import NewType
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import numpy.typing as npt

from streamer.core.audio import Resampler, WireDecoder
from streamer.core.container import Samples
from streamer.core.errors import (
    ConfigError,
    EngineFailure,
    FrameTooLarge,
    IdleTimeout,
    InternalError,
    InvalidState,
    ProtocolError,
    ServerShutdown,
    SessionTooLong,
    SlowReader,
    UnknownSession,
)
from streamer.core.events import Event, Final, Lost, NonSpeech, Partial, SpeechEnded, SpeechStarted, Word
from streamer.core.options import CoreOptions, for_the_model
from streamer.core.origin import StreamOrigin
from streamer.core.stream import StreamCore
from streamer.core.units import SAMPLE_RATE, samples_to_seconds
from streamer.engine import silero_vad
from streamer.engine.types import StreamId, check_supported
from streamer.server.adapter import FLUSH_GAVE_UP, LOST, Adapter, Close, FlushBound, SendLimits, session_log
from streamer.server.arrivals import ArrivalLog
from streamer.server.auth import Principal
from streamer.server.client_messages import Configure, End, Finalize, parse_client_message
from streamer.server.container_input import ContainerInput
from streamer.server.listen_query import LISTEN_PATH, ListenParams, parse_listen_query, parse_resume_query
from streamer.server.metrics import ServerMetrics, percentile
from streamer.server.ratelimit import AudioRateLimiter, RateLimitOptions
from streamer.server.resume import ChannelRecord, KeptFinal, ResumeRegistry, SessionRecord, SessionStore
from streamer.server.scheduler import CoreClient, Scheduler
from streamer.server.server_messages import (
    Done,
    ErrorMessage,
    FinalMessage,
    LatencySummary,
    LostRange,
    PartialMessage,
    Percentiles,
    Ready,
    ResumeHint,
    ServerMessage,
    SpeechEndedMessage,
    SpeechStartedMessage,
    WordMessage,
    serialize,
)
from streamer.server.status import SessionSnapshot, latency_percentiles

__all__ = [
    "Session",
    "SessionId",
    "SessionOptions",
    "SessionState",
    "Takeover",
    "new_session_id",
    "open_listen_session",
]

logger = logging.getLogger(__name__)

# the arrival log is cut back every this many frames (a few seconds of 100 ms frames), keeping what any transcript
# still to be made may need, and a window's length (30 s) more for safety
_ARRIVALS_PRUNE_EVERY = 64
_ARRIVALS_MARGIN = 30 * SAMPLE_RATE

SessionId = NewType("SessionId", str)


def new_session_id() -> SessionId:
    return SessionId(secrets.token_hex(6))


@dataclass(frozen=True)
class SessionOptions:
    """Limits of one session. Validated in :meth:`validate`."""

    # binary frames larger than this get frame_too_large (close 1009); 1 MiB is 2.7 s of 48 kHz stereo float32
    max_frame_bytes: int = 1 << 20
    # seconds without any frame (audio or keepalive) before idle_timeout (close 4408)
    idle_timeout: float = 10.0
    # wall-clock seconds a session may last before session_too_long (close 4408)
    max_session_seconds: float = 4 * 3600.0
    # messages waiting for a slow reader; stale partials are dropped first, then the session closes (slow_reader)
    send_buffer: int = 256
    # the kernel's send buffer of the connection (SO_SNDBUF), in bytes: without a bound, Linux grows it to megabytes
    # and a reader that stopped reading is noticed only once that much is queued; 0 leaves the kernel's default
    socket_send_buffer: int = 128 * 1024
    # once a stream has ended, seconds the engine may go without progress (none of the stream's audio accounted for,
    # no window of any stream decoded) before the rest is reported lost (FlushBound: it waits while the engine works);
    # also how long the queued messages get to go out before the close. The server's one flush bound: /twilio,
    # /v1/realtime and Deepgram's get it too
    flush_timeout: float = 10.0
    # a message the connection cannot take for this long (its buffers full: the client stopped reading) ends the
    # session with slow_reader (4408); the count-based send_buffer catches a reader that is slow but alive
    slow_reader_seconds: float = 10.0
    # how fast a client may send audio (a burst, then a multiple of real time); faster gets rate_limited (4429)
    rate_limit: RateLimitOptions = field(default_factory=RateLimitOptions)
    # seconds a session whose connection dropped waits for the client to resume it; 0 ends it at once
    resume_grace_seconds: float = 30.0
    # finals kept for a resuming client (the newest; older ones it surely received). Finals made while it is away
    # (the grace period) plus those in flight when the connection dropped: a few dozen. Each kept final holds its
    # words, so this bounds what a long session keeps (1000 held about 2 MB per session, growing for an hour)
    resume_finals: int = 200

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.max_frame_bytes < 4:
            raise ConfigError("max_frame_bytes must be at least 4")
        for name in ("idle_timeout", "max_session_seconds", "flush_timeout", "slow_reader_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if self.send_buffer < 2:
            raise ConfigError("send_buffer must be at least 2")
        if self.socket_send_buffer < 0:
            raise ConfigError("socket_send_buffer must be >= 0")
        if self.resume_grace_seconds < 0:
            raise ConfigError("resume_grace_seconds must be >= 0")
        if self.resume_finals < 1:
            raise ConfigError("resume_finals must be at least 1")
        self.rate_limit.validate()


class SessionState(Enum):
    CONNECTING = "connecting"  # handshake done; query and admission not yet checked
    STREAMING = "streaming"  # ready sent; audio flows
    DRAINING = "draining"  # no more audio; waiting for the last finals
    PARKED = (
        "parked"  # the connection dropped mid-stream; waiting for the client to resume (see streamer.server.resume)
    )
    CLOSED = "closed"


class _ListenChannel(CoreClient):
    """One channel of a session: its core (with its resampler) and what it has accounted for. A channel taken over
    from a record (:class:`~streamer.server.resume.ChannelRecord`) starts where that one stood."""

    def __init__(
        self,
        session: Session,
        index: int,
        core: StreamCore,
        sample_rate: int,
        taken: ChannelRecord | None = None,
        skip: int = 0,
    ) -> None:
        super().__init__(core, sample_rate, session.after_core_update)
        self.session = session
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


@dataclass(frozen=True)
class Takeover:
    """A session continued from its record (another process ran it until its connection dropped; see
    :mod:`streamer.server.resume`).

    Each channel's new core starts its accounting exactly where the record's ends (``accounted``) and is fed the
    audio from the record's ``replay_from`` (the open utterance's context, at most 30 s before) so that it decodes
    that utterance as the old core would have (issue 18). The client resends its audio from the frame
    :attr:`resume_frame`: a frame on the client's clock that falls on a 16 kHz sample (16000 / gcd(rate, 16000)
    samples apart: 1 at 48 kHz, 2 at 8 kHz, 160 at 44.1 kHz), at or before every channel's accounted position, at
    or after the oldest frame the client still holds (``resend_from``) when it can be; each channel drops what it
    resends before its own replay start (:meth:`replay_from`)."""

    record: SessionRecord
    # the seq of the last final the client received: the finals after it are replayed
    last_seq: int
    params: ListenParams
    # the oldest frame the client still holds (its resend_from): nothing before it is asked for
    resend_from: int = 0

    @property
    def resume_frame(self) -> int:
        """The client's first frame to send, counted from the start of the stream."""
        rate = self.params.sample_rate
        grid = SAMPLE_RATE // math.gcd(rate, SAMPLE_RATE)
        accounted = min(c.accounted for c in self.record.channels)
        if self.params.container is not None:  # the client sends a new file from where it is: no context to resend
            return accounted // grid * grid * rate // SAMPLE_RATE
        held = -(-self.resend_from * SAMPLE_RATE // rate)  # the client's oldest frame, in stream samples (rounded up)
        wanted = max(min(c.replay_from for c in self.record.channels), held)
        sample = -(-wanted // grid) * grid  # up to the grid: the client holds it
        if sample > accounted:
            # the client no longer holds audio that no final covers: it resends from the accounted position, the
            # frames it lacks as silence, and reports them lost (streamer.reconnect)
            sample = accounted // grid * grid
        return sample * rate // SAMPLE_RATE

    @property
    def resume_sample(self) -> int:
        """:attr:`resume_frame` in 16 kHz stream samples (exact: the frame falls on a sample)."""
        return self.resume_frame * SAMPLE_RATE // self.params.sample_rate

    def replay_from(self, channel: int) -> int:
        """Where channel ``channel``'s new core is fed audio from (:attr:`StreamOrigin.replay_from`): its record's
        context start, or later where the client resends from later; its accounted position for a container."""
        taken = self.record.channels[channel]
        if self.params.container is not None:
            return taken.accounted
        return max(self.resume_sample, taken.replay_from)


@dataclass(frozen=True)
class _Transcript:
    """A partial or final waiting in the send buffer; its latency is measured when it is actually sent."""

    channel: int
    event: Partial | Final
    seq: int = 0  # finals only: 1, 2, 3, ... per session
    # when the last sample the text needed arrived (None: before any audio), stamped when the event is made, so a
    # final replayed on resume long after is still dated right once the arrival log has forgotten its audio
    arrived: float | None = None


@dataclass(frozen=True)
class _Summary:
    """``done``, in the send buffer: made as it goes out, so that its latency figures cover every transcript sent
    before it."""


_Outgoing = ServerMessage | _Transcript | _Summary


class _Outbox:
    """The bounded send buffer. A newer partial replaces a queued one of the same channel; when full, the oldest
    partial is dropped; when only finals and other must-send messages fill it, the reader is too slow."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: deque[_Outgoing] = deque()
        self.dropped_partials = 0

    @staticmethod
    def _is_partial(item: _Outgoing, channel: int | None = None) -> bool:
        return (
            isinstance(item, _Transcript)
            and isinstance(item.event, Partial)
            and (channel is None or item.channel == channel)
        )

    def _drop_first_partial(self, channel: int | None = None) -> bool:
        for item in self.items:
            if self._is_partial(item, channel):
                self.items.remove(item)
                self.dropped_partials += 1
                return True
        return False

    def put(self, item: _Outgoing) -> None:
        """Queue ``item``; raise :class:`~streamer.core.errors.SlowReader` when it cannot fit."""
        if isinstance(item, _Transcript) and isinstance(item.event, Partial):
            self._drop_first_partial(item.channel)  # superseded by the newer one
        if len(self.items) >= self.capacity and not self._drop_first_partial():
            raise SlowReader(f"the client did not read {self.capacity} messages in time")
        self.items.append(item)


def _nothing() -> None:
    return None


class Session(Adapter):
    """One ``/v1/listen`` stream, sans-I/O (:mod:`streamer.server.adapter`), from the ``ready`` it says on construction
    to its close; :func:`open_listen_session` makes one, or claims a parked one back with :meth:`resume`.

    The story: 1-2 (construction) the request's parameters, one core per channel, ``ready``; 3 frames until ``end``,
    an error, a lost connection or shutdown; 4 a dropped connection parks the session (see the module docstring);
    5 otherwise every final the cores can still produce, while they make progress (``flush_timeout``, FlushBound);
    6 ``done`` or the error, and the close code that goes with it; 7 the cores let go of (:meth:`release`, unless
    parked).
    """

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
    ) -> None:
        super().__init__()
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
        self.state = SessionState.CONNECTING
        self.channels: list[_ListenChannel] = []
        self._params = params
        self._decoder = WireDecoder(params.audio_format)
        self._limiter = AudioRateLimiter(options.rate_limit, now)
        # containerised audio (encoding=opus or container) goes through this instead, to _feed_samples
        self._container = (
            None
            if params.container is None
            else ContainerInput(
                params.container, params.channels, options.rate_limit, self._limiter, self._feed_samples
            )
        )
        self._outbox = _Outbox(options.send_buffer)
        # when audio arrived (16 kHz samples per channel): the clock of every transcript's latency_ms
        self._arrivals = ArrivalLog()
        self._latencies: dict[str, list[float]] = {"partial": [], "final": []}
        self._opened = now
        self._last_frame = now
        # frames (one sample per channel, at the client's rate) accepted: where a resuming client goes on from
        self._frames_received = 0
        # the newest finals, kept for a resuming client; every final up to _forgotten_seq was dropped from it
        self.finals: deque[_Transcript] = deque()
        self._seq = 0
        self._forgotten_seq = 0
        # lost-audio errors that found no connection to go out on; the next connection gets them first
        self._undelivered: list[ErrorMessage] = []
        # why the stream ends (None: the client's end), and how long the cores may take to finish it
        self._error: ProtocolError | None = None
        self._flush = FlushBound(options.flush_timeout)
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
                self.channels.append(_ListenChannel(self, index, core, params.sample_rate))
                continue
            # a session taken over: each core starts where the record's accounting of its channel ends
            taken = takeover.record.channels[index]
            context = tuple(
                w
                for f in takeover.record.finals
                if f.channel == index
                for w in f.final.words
                if w.end <= taken.accounted
            )
            replay_from = takeover.replay_from(index)
            origin = StreamOrigin(taken.accounted, taken.next_segment_id, context, replay_from)
            core = StreamCore(core_options, stream_id, origin, vad_classifiers=vad_classifiers)
            # a container's client sends a new file from where it is, not the old one's audio again: nothing to skip
            skip = 0 if params.container is not None else replay_from - takeover.resume_sample
            self.channels.append(_ListenChannel(self, index, core, params.sample_rate, taken, skip))
        for channel in self.channels:
            self.scheduler.register(channel)
        if takeover is None:
            self._put(self._ready(resumed=False))
        else:
            self._take_over(takeover)
        self.state = SessionState.STREAMING
        self._log.info(
            "session=%s event=%s encoding=%s sample_rate=%d channels=%d language=%s",
            self.id,
            "open" if takeover is None else "taken_over",
            params.encoding.value,
            params.sample_rate,
            params.channels,
            params.language,
        )
        self._save()

    def _take_over(self, takeover: Takeover) -> None:
        """2b. The session goes on from its record: its seq, the finals after ``last_seq`` (kept until the next resume
        acknowledges them), and ``ready`` saying from which frame the client resends its audio."""
        record = takeover.record
        self.owner = record.owner  # a resumed session keeps its owner, whoever resumes it (an admin may)
        self._seq = self._forgotten_seq = record.seq
        self._frames_received = takeover.resume_frame
        if self._container is not None:
            self._container.seconds = takeover.resume_sample / SAMPLE_RATE
        for kept in record.finals:
            if kept.seq > takeover.last_seq:
                self.finals.append(_Transcript(kept.channel, kept.final, kept.seq))
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
        if self.state is not SessionState.PARKED:
            raise InvalidState(f"only a parked session can be resumed, not a {self.state.value} one")
        self._close = None
        self._outbox = _Outbox(self.options.send_buffer)
        self._last_frame = now
        self._decoder.flush()  # a sample cut in half by the drop is not audio; the client resends from a frame
        if self._container is not None:
            self._container.restart(now)  # the new connection starts a new file (a recorder restarted)
        # the client has every final up to last_seq: forget them, and send it the rest before anything new
        while self.finals and self.finals[0].seq <= last_seq:
            self._forgotten_seq = self.finals.popleft().seq
        self.state = SessionState.STREAMING
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

    def receive_timer(self, now: float) -> None:
        if self.state is SessionState.STREAMING:
            if now >= self._last_frame + self.options.idle_timeout:
                self._end(IdleTimeout(f"no audio or keepalive for {self.options.idle_timeout:g} s"), now)
            elif now >= self._opened + self.options.max_session_seconds:
                self._end(SessionTooLong(f"sessions may last at most {self.options.max_session_seconds:g} s"), now)
        elif self.state is SessionState.DRAINING and self._flush.expired(now, self._progress()):
            self._log.warning(
                "session=%s event=flush_timeout waited_s=%.1f extensions=%d",
                self.id,
                now - self._flush.ended,
                self._flush.extensions,
            )
            for channel in self.channels:
                for start, end in channel.gaps():
                    with contextlib.suppress(SlowReader):
                        self._report_lost(channel, start, end, FLUSH_GAVE_UP)
            self._last_word()

    def receive_shutdown(self, now: float) -> None:
        """The server is going down: stop receiving, flush the finals (for at most ``flush_timeout`` from now, progress
        or not: the server waits that long and a little more), then close with 1001."""
        self._end(ServerShutdown("the server is shutting down"), now)
        self._flush.cap(now + self.options.flush_timeout)  # a flush under way already (after end) is capped too

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        """Mid-stream, a dropped connection parks the session (4); one the client closed ends it without a flush.
        Once the stream has ended, the flush goes on (its finals count) and nothing more is sent."""
        if self.state is not SessionState.STREAMING:
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

    @property
    def reading(self) -> bool:
        return self.state is SessionState.STREAMING

    def next_deadline(self) -> float | None:
        if self.state is SessionState.STREAMING:
            return min(self._last_frame + self.options.idle_timeout, self._opened + self.options.max_session_seconds)
        if self.state is SessionState.DRAINING:
            return self._flush.deadline
        return None

    def messages_to_send(self, now: float, limit: int | None = None) -> list[str]:
        """Queued messages, oldest first; each transcript's latency is measured now, as it goes out."""
        items = self._outbox.items
        count = len(items) if limit is None else min(limit, len(items))
        return [serialize(self._render(items.popleft(), now)) for _ in range(count)]

    def release(self) -> None:
        """7. Let go of the cores and the scheduler, unless the session is parked (then :meth:`expire` does). The
        runner calls it as the connection's run ends: after the last word, the close has been sent by then."""
        if self.state is SessionState.PARKED:
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
        self.state = SessionState.CLOSED
        if not self._unregistered:
            self._unregistered = True
            for channel in self.channels:
                self.scheduler.unregister(channel)
            if self.store is not None:
                self.store.drop(self.id)

    # -- the story --------------------------------------------------------------------------------------------------

    def _receive(self, frame: str | bytes, now: float) -> None:
        if self.state is not SessionState.STREAMING:
            return
        self._last_frame = now
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
        for channel in self.channels:
            channel.core.receive_configure(prompt, keywords)
        # the query a replica taking the session over rebuilds it from (SessionRecord.query) carries them too
        self._params = replace(params, prompt=prompt, keywords=keywords)
        self._save()
        self._log.info(
            "session=%s event=configure prompt_chars=%d keywords=%d",
            self.id,
            len(prompt),
            len(keywords),
        )

    def _end(self, error: ProtocolError | None, now: float) -> None:
        """The stream ends: 5. flush (unless the reader is too slow for it to matter), then 6. the last word."""
        if self.state is not SessionState.STREAMING:
            return
        self._error = error
        if isinstance(error, SlowReader):
            self._last_word()
            return
        # 5. Whatever the reason, flush: every final the cores can still produce goes out before the close.
        self.state = SessionState.DRAINING
        unaccounted = sum(c.core.samples_received - c.accounted for c in self.channels)
        self._flush.start(now, self._progress(), samples_to_seconds(unaccounted))
        self._decoder.flush()  # an incomplete trailing frame is not audio; nothing to account
        if self._container is not None:
            # 5. The container's last samples, and the error if it was cut short (after any error that ended it).
            cut_short = self._container.end(now)
            if cut_short is not None:
                self._log.info(
                    "session=%s event=container_error code=%s reason=%r", self.id, cut_short.code, cut_short.message
                )
                self._error = self._error or cut_short
        for channel in self.channels:
            self._feed(channel, channel.resampler.flush(), now)
            channel.core.receive_end_of_stream()
        self.after_core_update()  # the last word may be said at once

    def _last_word(self) -> None:
        """6. ``done`` after a clean end, else the error; then the close code that goes with it."""
        error = self._error
        last: _Outgoing = _Summary()
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
        params = self._params
        received = self._frames_received / params.sample_rate
        if self._container is not None:
            received = self._container.seconds
        return Ready(
            session_id=self.id,
            model=self.model,
            # a container's rate is the container's, unknown until its header: 0 says so
            sample_rate=0 if params.container is not None else params.sample_rate,
            encoding=params.encoding.value,
            channels=params.channels,
            resumed=resumed,
            audio_seconds_received=round(received, 6),
            resume_from=round(received, 6),
        )

    def _park(self) -> bool:
        """The connection dropped mid-stream: wait in the registry for a resume. False when resume is off."""
        if self.registry is None or self.options.resume_grace_seconds <= 0:
            return False
        self.state = SessionState.PARKED
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
        if self.state is not SessionState.PARKED:
            return
        unsent = [f.seq for f in self.finals]
        self._log.info("session=%s event=expired unacknowledged_finals=%d", self.id, len(unsent))
        self._unregister()

    def snapshot(self, now: float) -> SessionSnapshot:
        """The session as ``GET /status`` shows it, as of ``now`` (``time.monotonic()``)."""

        def total(samples: int) -> float:
            return round(samples_to_seconds(samples), 3)

        received = sum(c.core.samples_received for c in self.channels)
        accounted = sum(c.transcribed + c.non_speech + c.lost for c in self.channels)
        return SessionSnapshot(
            id=self.id,
            kind="listen",
            age_seconds=round(now - self._opened, 3),
            channels=len(self.channels),
            audio_seconds=total(received),
            lag_seconds=total(sum(c.core.backlog_samples for c in self.channels)),
            uncommitted_seconds=total(received - accounted),
            partial_latency_ms=latency_percentiles(self._latencies["partial"]),
            final_latency_ms=latency_percentiles(self._latencies["final"]),
        )

    # -- audio ------------------------------------------------------------------------------------------------------

    def _receive_audio(self, frame: bytes, now: float) -> None:
        if len(frame) > self.options.max_frame_bytes:
            raise FrameTooLarge(
                f"binary frames may hold at most {self.options.max_frame_bytes} bytes, this one had {len(frame)}"
            )
        if self._container is not None:
            self._container.receive(frame, now)
            return
        # charged before decoding, whole frames only: a flood costs neither decoding nor engine time
        frames = len(frame) // self._params.audio_format.frame_bytes
        self._limiter.receive(frames, self._params.sample_rate, now)
        per_channel = self._decoder.decode(frame)
        self._frames_received += per_channel.shape[1]
        for channel, samples in zip(self.channels, per_channel, strict=True):
            self._feed(channel, channel.resampler.process(samples), now)

    def _feed_samples(self, samples: Samples, now: float) -> None:
        """Decoded container audio, one row per channel (ContainerInput mixed it down for one): each channel's
        resampler follows the container's rate."""
        for channel, mono in zip(self.channels, samples.audio, strict=True):
            if channel.resampler.rate_in != samples.sample_rate:  # the first samples (or a file of another rate)
                self._feed(channel, channel.resampler.flush(), now)
                channel.resampler = Resampler(samples.sample_rate, SAMPLE_RATE)
            self._feed(channel, channel.resampler.process(mono), now)

    def _feed(self, channel: _ListenChannel, samples: npt.NDArray[np.float32], now: float) -> None:
        if channel.skip:  # resent audio the record accounted for already (a session taken over)
            dropped = min(channel.skip, len(samples))
            channel.skip -= dropped
            samples = samples[dropped:]
        if not len(samples):
            return
        channel.core.receive_audio(samples)
        channel.offered = True
        self.metrics.audio_received.inc(samples_to_seconds(len(samples)))
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
                for event in channel.core.events_received():
                    self._forward(channel, event)
            if self._positions() != self._saved:
                self._save()
        except SlowReader as error:
            if self.state is SessionState.DRAINING:
                self._error = error
                self._last_word()
            else:
                self._end(error, self._last_frame)
        if self.state is SessionState.DRAINING and all(c.core.done for c in self.channels):
            self._last_word()
        self.scheduler.notify()
        self.wakeup()

    def _progress(self) -> int:
        """What the flush bound watches: samples accounted for, over every channel, and the engine's outcomes."""
        return sum(c.accounted for c in self.channels) + self.scheduler.outcomes

    def _positions(self) -> list[tuple[int, int]]:
        return [c.position() for c in self.channels]

    def _forward(self, channel: _ListenChannel, event: Event) -> None:
        if isinstance(event, SpeechStarted):
            self._put(SpeechStartedMessage(channel=channel.index, start=_seconds(event.start)))
        elif isinstance(event, SpeechEnded):
            self._put(
                SpeechEndedMessage(
                    channel=channel.index,
                    start=_seconds(event.start),
                    end=_seconds(event.end),
                    reason=event.reason.value,
                )
            )
        elif isinstance(event, Partial):
            self._put(_Transcript(channel.index, event, arrived=self._arrivals.arrival_of(event.audio_end)))
        elif isinstance(event, Final):
            channel.transcribed += event.end - event.start
            channel.account(event.start, event.end)
            self.metrics.audio_transcribed.inc(samples_to_seconds(event.end - event.start))
            self._seq += 1
            transcript = _Transcript(channel.index, event, self._seq, self._arrivals.arrival_of(event.audio_end))
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

    def _report_lost(self, channel: _ListenChannel, start: int, end: int, message: str) -> None:
        channel.lost += end - start
        channel.account(start, end)
        lost = LostRange(start=_seconds(start), end=_seconds(end))
        self._put(ErrorMessage(code=EngineFailure.code, message=message, lost=lost, channel=channel.index))

    def _done_message(self) -> Done:
        def total(samples: int) -> float:
            return round(samples_to_seconds(samples), 6)

        return Done(
            audio_seconds_received=total(sum(c.core.samples_received for c in self.channels)),
            audio_seconds_transcribed=total(sum(c.transcribed for c in self.channels)),
            non_speech_seconds=total(sum(c.non_speech for c in self.channels)),
            lost_seconds=total(sum(c.lost for c in self.channels)),
            latency=LatencySummary(partial=self._percentiles("partial"), final=self._percentiles("final")),
        )

    def _percentiles(self, kind: str) -> Percentiles:
        def ms(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        values = self._latencies[kind]
        return Percentiles(p50=ms(percentile(values, 50)), p95=ms(percentile(values, 95)))

    # -- sending ----------------------------------------------------------------------------------------------------

    def _put(self, item: _Outgoing) -> None:
        if self.state is SessionState.PARKED:
            # no connection: finals wait in self.finals, lost-audio errors here; partials and speech_* would
            # be stale by the time a client resumes
            if isinstance(item, ErrorMessage) and item.lost is not None:
                self._undelivered.append(item)
            return
        if self.close_action() is not None:
            return  # the last word is said
        self._outbox.put(item)

    def _render(self, item: _Outgoing, now: float) -> ServerMessage:
        if isinstance(item, _Summary):
            return self._done_message()
        if not isinstance(item, _Transcript):
            return item
        event = item.event
        latency_ms = 0.0 if item.arrived is None else round(max(0.0, now - item.arrived) * 1000, 1)
        words = tuple(_word(w) for w in event.words)
        fields = (item.channel, event.segment_id, event.text, _seconds(event.start), _seconds(event.end), words)
        if isinstance(event, Partial):
            self._latencies["partial"].append(latency_ms)
            self.metrics.partial_latency.observe(latency_ms / 1000)
            return PartialMessage(*fields, latency_ms=latency_ms, language=event.language)
        self._latencies["final"].append(latency_ms)
        self.metrics.final_latency.observe(latency_ms / 1000)
        return FinalMessage(*fields, latency_ms=latency_ms, seq=item.seq, language=event.language)

    def _oldest_audio_end(self) -> int:
        """A lower bound of the ``audio_end`` of every transcript still to be made: the windows still to decode end
        after their channel's buffered audio starts (made transcripts carry their arrival time)."""
        return min((c.core.buffer_start for c in self.channels), default=0) - _ARRIVALS_MARGIN


def _seconds(samples: int) -> float:
    return round(samples / SAMPLE_RATE, 4)


def _word(word: Word) -> WordMessage:
    return WordMessage(word.text, _seconds(word.start), _seconds(word.end), round(word.probability, 4))


def open_listen_session(
    path: str,
    owner: Principal,
    scheduler: Scheduler,
    core_options: CoreOptions,
    options: SessionOptions,
    model: str,
    metrics: ServerMetrics,
    registry: ResumeRegistry,
    now: float,
    store: SessionStore | None = None,
    record: SessionRecord | None = None,
) -> Session:
    """The adapter of a ``/v1/listen`` connection to ``path`` (with its query), opened by ``owner`` at ``now``: the
    parked session its query names, claimed back and resumed; or the session of ``record`` (another replica's, which
    the caller took over from ``store``: :meth:`~streamer.server.resume.SessionStore.take_over`), continued here; or
    else a new :class:`Session`, which may park in ``registry`` if its connection drops and keeps its record in
    ``store``. 1. What did the client ask for? A bad request, or a resume of a session this process does not keep for
    ``owner``, raises the :class:`~streamer.core.errors.ProtocolError` the runner refuses the connection with (an
    error, then its close code). Credentials, origin and the admission slot were the runner's
    (:mod:`streamer.server.routes`)."""
    try:
        takeover: Takeover | None = None
        if any(key == "resume" for key, _ in parse_qsl(urlsplit(path).query)):
            request = parse_resume_query(path)
            if request is None:
                raise UnknownSession("no resume parameter")
            if record is None:
                claimed = registry.claim(request.session_id, request.last_seq, owner)
                assert isinstance(claimed, Session)  # the registry holds only sessions
                claimed.resume(request.last_seq, now)
                return claimed
            params = parse_listen_query(f"{LISTEN_PATH}?{record.query}")
            resend_from = round(request.resend_from * params.sample_rate)
            takeover = Takeover(record, request.last_seq, params, resend_from)
        else:
            params = parse_listen_query(path)
        # a language the model cannot serve is refused here, not by the engine in a batch (issue 14, finding 2)
        decode = core_options.decode
        check_supported(scheduler.engine.info, params.language or decode.language, decode.task)
    except ProtocolError as refusal:
        logger.info("event=rejected code=%s reason=%r", refusal.code, refusal.message)
        raise
    session = Session(params, scheduler, core_options, options, model, now, metrics, registry, store, takeover)
    if takeover is None:
        session.owner = owner
    return session
