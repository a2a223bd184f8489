"""One ``/v1/listen`` connection: plumbing between the WebSocket, the stream cores and the scheduler.

The session decides nothing about transcription. It decodes binary frames (:class:`~streamer.audio.WireDecoder`),
resamples each channel to 16 kHz, feeds one :class:`~streamer.core.StreamCore` per channel with
``now=time.monotonic()`` (the only place that reads the clock), lets the :class:`~streamer.scheduler.Scheduler`
run the windows the cores ask for, and turns core events into protocol messages. It also enforces the limits:
frame size, idle timeout, session length and a bounded send buffer for slow readers.

Resume: when the connection drops mid-stream, the session parks itself in the server's
:class:`~streamer.resume.ResumeRegistry` for ``resume_grace_seconds`` instead of ending. Its cores stay registered
with the scheduler, finals keep their ``seq`` and stay in :attr:`Session.finals` (the last ``resume_finals`` of
them), and a connection that comes back with ``?resume=<id>&last_seq=<n>`` (:class:`Resumption`) is attached to
the same session: ``ready`` with ``resumed: true``, every final after ``n``, then the stream goes on where it was.

Accounting: each core reports every accepted sample in exactly one :class:`~streamer.events.Final`,
:class:`~streamer.events.NonSpeech` or :class:`~streamer.events.Lost`; the session forwards them all (a ``Lost`` as
an ``error`` naming its range) and sums them in ``done``. Audio the cores could not finish before the session had
to close is reported the same way, as ``error`` messages with ``lost`` ranges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections import deque
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, NewType
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import numpy.typing as npt
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from streamer.arrivals import ArrivalLog
from streamer.audio import WireDecoder
from streamer.auth import ANONYMOUS, Principal
from streamer.core import CoreOptions, StreamCore
from streamer.engine.types import StreamId, check_supported
from streamer.errors import (
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
from streamer.events import Event, Final, Lost, NonSpeech, Partial, SpeechStarted, Word
from streamer.metrics import ServerMetrics, percentile
from streamer.protocol import (
    Done,
    End,
    ErrorMessage,
    Finalize,
    FinalMessage,
    LatencySummary,
    ListenParams,
    LostRange,
    PartialMessage,
    Percentiles,
    Ready,
    ResumeHint,
    ServerMessage,
    SpeechStartedMessage,
    WordMessage,
    parse_client_message,
    parse_listen_query,
    parse_resume_query,
    serialize,
)
from streamer.ratelimit import AudioRateLimiter, RateLimitOptions
from streamer.resume import ResumeRegistry
from streamer.scheduler import CoreClient, Scheduler
from streamer.status import SessionSnapshot, latency_percentiles
from streamer.units import SAMPLE_RATE, samples_to_seconds

__all__ = [
    "Resumption",
    "Session",
    "SessionId",
    "SessionOptions",
    "SessionState",
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
    # seconds to wait for the engine to finish the last windows when a session ends; the rest is reported lost
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
        """Raise :class:`~streamer.errors.ConfigError` naming the first invalid field."""
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
    PARKED = "parked"  # the connection dropped mid-stream; waiting for the client to resume (see streamer.resume)
    CLOSED = "closed"


class _Channel(CoreClient):
    """One channel of a session: its core (with its resampler) and what it has accounted for."""

    def __init__(self, session: Session, index: int, core: StreamCore, sample_rate: int) -> None:
        super().__init__(core, sample_rate, session.after_core_update)
        self.session = session
        self.index = index
        # accounted samples (stream time), and the spans accounted, to name what is missing if we give up waiting
        self.transcribed = 0
        self.non_speech = 0
        self.lost = 0
        self.spans: list[tuple[int, int]] = []

    def account(self, start: int, end: int) -> None:
        self.spans.append((start, end))

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
class _Transcript:
    """A partial or final waiting in the send buffer; its latency is measured when it is actually sent."""

    channel: int
    event: Partial | Final
    seq: int = 0  # finals only: 1, 2, 3, ... per session
    # when the last sample the text needed arrived (None: before any audio), stamped when the event is made, so a
    # final replayed on resume long after is still dated right once the arrival log has forgotten its audio
    arrived: float | None = None


@dataclass(frozen=True)
class _Close:
    """The last item of the send buffer: close the connection once everything before it went out."""

    code: int
    reason: str


_Outgoing = ServerMessage | _Transcript | _Close


class _Outbox:
    """The bounded send buffer. A newer partial replaces a queued one of the same channel; when full, the oldest
    partial is dropped; when only finals and other must-send messages fill it, the reader is too slow."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: deque[_Outgoing] = deque()
        self.ready = asyncio.Event()
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
        """Queue ``item``; raise :class:`~streamer.errors.SlowReader` when it cannot fit (a close always fits)."""
        if isinstance(item, _Transcript) and isinstance(item.event, Partial):
            self._drop_first_partial(item.channel)  # superseded by the newer one
        full = len(self.items) >= self.capacity
        if full and not isinstance(item, _Close) and not self._drop_first_partial():
            raise SlowReader(f"the client did not read {self.capacity} messages in time")
        self.items.append(item)
        self.ready.set()


class Session:
    """Serve one stream from handshake to close; :meth:`run` is the whole story, :meth:`shutdown` cuts it short.

    Construct in the server's connection handler and ``await run()``; it never raises except on cancellation. With
    a ``registry``, a connection that drops mid-stream leaves the session parked there (see the module docstring);
    :class:`Resumption` attaches the next connection with :meth:`resume`.
    """

    def __init__(
        self,
        ws: ServerConnection,
        scheduler: Scheduler,
        core_options: CoreOptions,
        options: SessionOptions,
        model: str,
        metrics: ServerMetrics | None = None,
        registry: ResumeRegistry | None = None,
    ) -> None:
        self.id = new_session_id()
        # who opened the session (set by the server's runner): only it may resume it or see it on /status
        self.owner: Principal = ANONYMOUS
        self.ws = ws
        self.scheduler = scheduler
        self.core_options = core_options
        self.options = options
        self.model = model
        self.metrics = metrics if metrics is not None else scheduler.metrics
        self.registry = registry
        self.state = SessionState.CONNECTING
        self.channels: list[_Channel] = []
        self._params: ListenParams | None = None
        self._decoder: WireDecoder | None = None
        self._outbox = _Outbox(options.send_buffer)
        # why the session must stop early (server shutdown, slow reader); set once, by shutdown() or the outbox
        self._stop: asyncio.Future[ProtocolError] = asyncio.get_running_loop().create_future()
        self._all_done = asyncio.Event()
        # when audio arrived (16 kHz samples per channel): the clock of every transcript's latency_ms
        self._arrivals = ArrivalLog()
        self._latencies: dict[str, list[float]] = {"partial": [], "final": []}
        self._opened = time.monotonic()
        self._last_frame = self._opened
        self._limiter = AudioRateLimiter(options.rate_limit, self._opened)
        # frames (one sample per channel, at the client's rate) accepted: where a resuming client goes on from
        self._frames_received = 0
        # the newest finals, kept for a resuming client; every final up to _forgotten_seq was dropped from it
        self.finals: deque[_Transcript] = deque()
        self._seq = 0
        self._forgotten_seq = 0
        # lost-audio errors that found no connection to go out on; the next connection gets them first
        self._undelivered: list[ErrorMessage] = []

    # -- the story --------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes. Never raises (but propagates cancellation)."""
        log = f"session={self.id}"
        # 1. What did the client ask for? A bad request is an error, then a close. (Credentials, origin and the
        #    admission slot were the runner's: see streamer.routes.)
        try:
            params = parse_listen_query(self.ws.request.path if self.ws.request else "")
            # a language the model cannot serve is refused here, not by the engine in a batch (issue 14, finding 2)
            decode = self.core_options.decode
            check_supported(self.scheduler.engine.info, params.language or decode.language, decode.task)
        except ProtocolError as rejection:
            logger.info("%s event=rejected code=%s reason=%r", log, rejection.code, rejection.message)
            await self._send_now(ErrorMessage(code=rejection.code, message=rejection.message))
            await self.ws.close(rejection.close_code, rejection.code)
            self.state = SessionState.CLOSED
            return
        try:
            # 2. One core per channel, each registered with the scheduler; then tell the client we are ready.
            self._params = params
            _bound_socket_send_buffer(self.ws, self.options.socket_send_buffer)
            self._decoder = WireDecoder(params.audio_format)
            core_options = self.core_options
            if params.language is not None:
                core_options = replace(core_options, decode=replace(core_options.decode, language=params.language))
            for index in range(params.channels):
                core = StreamCore(core_options, StreamId(f"{self.id}/{index}"))
                self.channels.append(_Channel(self, index, core, params.sample_rate))
            for channel in self.channels:
                self.scheduler.register(channel)
            self._put(self._ready(resumed=False))
            self.state = SessionState.STREAMING
            logger.info(
                "%s event=open encoding=%s sample_rate=%d channels=%d language=%s",
                log,
                params.encoding.value,
                params.sample_rate,
                params.channels,
                params.language,
            )
        except BaseException:
            self._release()
            raise
        # 3-6. Serve this connection; the rest of the story is the same on a resumed one.
        await self._serve()

    async def resume(self, ws: ServerConnection, last_seq: int) -> None:
        """Attach a new connection to this parked session (the registry's :meth:`~ResumeRegistry.claim` returned
        it) and serve it like :meth:`run`: ``ready`` with ``resumed: true``, the finals after ``last_seq``, the
        lost-audio errors that found no connection, then the live stream. Never raises (but propagates
        cancellation)."""
        if self.state is not SessionState.PARKED:
            raise InvalidState(f"only a parked session can be resumed, not a {self.state.value} one")
        self.ws = ws
        self._outbox = _Outbox(self.options.send_buffer)
        self._stop = asyncio.get_running_loop().create_future()
        self._last_frame = time.monotonic()
        if self._decoder is not None:
            self._decoder.flush()  # a sample cut in half by the drop is not audio; the client resends from a frame
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
        logger.info("session=%s event=resumed last_seq=%d replayed=%d", self.id, last_seq, len(self.finals))
        await self._serve()

    async def _serve(self) -> None:
        """Serve the attached connection until the stream ends or the connection drops (the session parks)."""
        log = f"session={self.id}"
        sender = asyncio.create_task(self._send_loop(), name=f"session-{self.id}-send")
        parked = False
        try:
            # 3. Receive until the client ends the stream, breaks a rule, goes away, or the server stops us.
            error = await self._receive_until_end()
            # 4. Gone mid-stream: park, keeping the cores working and every final, for a resuming client.
            if isinstance(error, _Gone) and self._park():
                parked = True
                return
            # 5. Whatever the reason, flush: every final the cores can still produce goes out before the close.
            if not isinstance(error, (SlowReader, _Gone)):
                await self._drain()
            # 6. The last word: done after a clean end, else the error; then the close code that goes with it.
            if isinstance(error, _Gone):
                logger.info("%s event=gone code=%s", log, self.ws.close_code)
            elif error is None:
                self._put(self._done_message())
                await self._close_after_sending(sender, 1000, "done")
            else:
                if isinstance(error, SlowReader):
                    self._outbox.items.clear()  # nothing queued can reach this reader in time; say why instead
                hint = ResumeHint(self.id, self._seq) if isinstance(error, ServerShutdown) else None
                self._put(ErrorMessage(code=error.code, message=error.message, resume=hint))
                await self._close_after_sending(sender, error.close_code, error.code)
            logger.info(
                "%s event=closed code=%s received_s=%.2f dropped_partials=%d",
                log,
                self.ws.close_code,
                sum(samples_to_seconds(c.core.samples_received) for c in self.channels),
                self._outbox.dropped_partials,
            )
        finally:
            # 7. Let go of everything, whatever happened above (unless parked: expire() does it later).
            sender.cancel()
            if not parked:
                self._release()

    def _ready(self, resumed: bool) -> Ready:
        params = self._params
        assert params is not None
        return Ready(
            session_id=self.id,
            model=self.model,
            sample_rate=params.sample_rate,
            encoding=params.encoding.value,
            channels=params.channels,
            resumed=resumed,
            audio_seconds_received=round(self._frames_received / params.sample_rate, 6),
        )

    def _park(self) -> bool:
        """The connection dropped mid-stream: wait in the registry for a resume. False when resume is off, or when
        the connection did not drop but was closed: by the client (it is done), or by the server for a protocol
        violation (1002, 1007, 1009: that client is broken, not its network)."""
        if self.registry is None or self.options.resume_grace_seconds <= 0 or self.state is not SessionState.STREAMING:
            return False
        protocol = self.ws.protocol
        if protocol.close_rcvd is not None or (
            protocol.close_sent is not None and protocol.close_sent.code in (1002, 1007, 1009)
        ):
            return False
        self.state = SessionState.PARKED
        # a parked session holds no admission slot (the runner releases the connection's when run() returns), or
        # dropped connections could fill the server (the registry keeps at most max_sessions of them); a resume
        # takes a slot again, as every connection does
        # lost-audio errors still queued never went out: keep them for the next connection (finals are in .finals)
        self._undelivered.extend(
            item for item in self._outbox.items if isinstance(item, ErrorMessage) and item.lost is not None
        )
        self._outbox.items.clear()
        self.registry.park(self, self.options.resume_grace_seconds, limit=self.scheduler.options.max_sessions)
        return True

    def check_resume(self, last_seq: int) -> None:
        """Raise :class:`~streamer.errors.UnknownSession` unless every final after ``last_seq`` is still kept."""
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
        logger.info("session=%s event=expired unacknowledged_finals=%d", self.id, len(unsent))
        self._release()

    def _release(self) -> None:
        self.state = SessionState.CLOSED
        for channel in self.channels:
            self.scheduler.unregister(channel)

    def shutdown(self) -> None:
        """The server is going down: stop receiving, flush the finals, then close with 1001."""
        self._fail(ServerShutdown("the server is shutting down"))

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

    # -- receiving --------------------------------------------------------------------------------------------------

    async def _receive_until_end(self) -> ProtocolError | _Gone | None:
        """Handle frames until ``end`` (returns None) or an error (returned, to be reported)."""
        try:
            while True:
                frame = await self._next_frame()
                now = self._last_frame
                if isinstance(frame, bytes):
                    self._receive_audio(frame, now)
                else:
                    message = parse_client_message(frame)
                    if isinstance(message, End):
                        return None
                    if isinstance(message, Finalize):
                        for channel in self.channels:
                            channel.core.receive_finalize(now)
                self.after_core_update()
        except ProtocolError as error:
            return error
        except ConnectionClosed:
            return _Gone()
        except Exception:
            logger.exception("session=%s event=internal_error", self.id)
            return InternalError("internal server error")

    async def _next_frame(self) -> str | bytes:
        """The next frame, or raise the reason there will be none (idle, too long, stopped)."""
        idle_deadline = self._last_frame + self.options.idle_timeout
        session_deadline = self._opened + self.options.max_session_seconds
        timeout = max(0.0, min(idle_deadline, session_deadline) - time.monotonic())
        receiving: asyncio.Future[Any] = asyncio.ensure_future(self.ws.recv())
        stop: asyncio.Future[Any] = self._stop
        done, _ = await asyncio.wait({receiving, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if receiving in done:
            self._last_frame = time.monotonic()
            frame: str | bytes = receiving.result()
            return frame
        receiving.cancel()  # safe: websockets keeps the message for the next recv()
        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
            await receiving
        if self._stop.done():
            raise self._stop.result()
        if idle_deadline <= session_deadline:
            raise IdleTimeout(f"no audio or keepalive for {self.options.idle_timeout:g} s")
        raise SessionTooLong(f"sessions may last at most {self.options.max_session_seconds:g} s")

    def _receive_audio(self, frame: bytes, now: float) -> None:
        if len(frame) > self.options.max_frame_bytes:
            raise FrameTooLarge(
                f"binary frames may hold at most {self.options.max_frame_bytes} bytes, this one had {len(frame)}"
            )
        assert self._decoder is not None and self._params is not None
        # charged before decoding, whole frames only: a flood costs neither decoding nor engine time
        frames = len(frame) // self._params.audio_format.frame_bytes
        self._limiter.receive(frames, self._params.sample_rate, now)
        per_channel = self._decoder.decode(frame)
        self._frames_received += per_channel.shape[1]
        for channel, samples in zip(self.channels, per_channel, strict=True):
            self._feed(channel, channel.resampler.process(samples), now)

    def _feed(self, channel: _Channel, samples: npt.NDArray[np.float32], now: float) -> None:
        if not len(samples):
            return
        channel.core.receive_audio(samples, now)
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
        except SlowReader as error:
            self._fail(error)
        if self.state is SessionState.DRAINING and all(c.core.done for c in self.channels):
            self._all_done.set()
        self.scheduler.notify()

    def _forward(self, channel: _Channel, event: Event) -> None:
        if isinstance(event, SpeechStarted):
            self._put(SpeechStartedMessage(channel=channel.index, start=_seconds(event.start)))
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

    def _report_lost(self, channel: _Channel, start: int, end: int, message: str) -> None:
        channel.lost += end - start
        channel.account(start, end)
        lost = LostRange(start=_seconds(start), end=_seconds(end))
        self._put(ErrorMessage(code=EngineFailure.code, message=message, lost=lost, channel=channel.index))

    async def _drain(self) -> None:
        """End every stream, wait for the cores to account for everything, and report what they could not."""
        self.state = SessionState.DRAINING
        now = time.monotonic()
        if self._decoder is not None:
            self._decoder.flush()  # an incomplete trailing frame is not audio; nothing to account
        for channel in self.channels:
            self._feed(channel, channel.resampler.flush(), now)
            channel.core.receive_end_of_stream(now)
        self.after_core_update()
        try:
            async with asyncio.timeout(self.options.flush_timeout):
                await self._all_done.wait()
        except TimeoutError:
            logger.warning("session=%s event=flush_timeout", self.id)
            for channel in self.channels:
                for start, end in channel.gaps():
                    with contextlib.suppress(SlowReader):
                        self._report_lost(channel, start, end, "the engine did not finish this audio in time")

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
            # no connection: finals wait in self.finals, lost-audio errors here; partials and speech_started would
            # be stale by the time a client resumes
            if isinstance(item, ErrorMessage) and item.lost is not None:
                self._undelivered.append(item)
            return
        self._outbox.put(item)

    def _fail(self, error: ProtocolError) -> None:
        if not self._stop.done():
            self._stop.set_result(error)

    async def _send_loop(self) -> None:
        """Send queued messages in order, measuring each transcript's latency at the moment it goes out; close the
        connection on reaching a :class:`_Close`."""
        outbox = self._outbox
        try:
            while True:
                await outbox.ready.wait()
                while outbox.items:
                    item = outbox.items.popleft()
                    if isinstance(item, _Close):
                        await self.ws.close(item.code, item.reason)
                        return
                    # the frame is written at once; only the wait for the connection's buffers to drain can time out
                    async with asyncio.timeout(self.options.slow_reader_seconds):
                        await self.ws.send(serialize(self._render(item)))
                outbox.ready.clear()
        except ConnectionClosed:
            self._fail(_Gone())
        except TimeoutError:
            seconds = self.options.slow_reader_seconds
            logger.warning("session=%s event=slow_reader unsent=%d", self.id, len(outbox.items))
            self._fail(SlowReader(f"the client did not read for {seconds:g} s"))

    def _render(self, item: ServerMessage | _Transcript) -> ServerMessage:
        if not isinstance(item, _Transcript):
            return item
        event = item.event
        latency_ms = 0.0 if item.arrived is None else round(max(0.0, time.monotonic() - item.arrived) * 1000, 1)
        words = tuple(_word(w) for w in event.words)
        fields = (item.channel, event.segment_id, event.text, _seconds(event.start), _seconds(event.end), words)
        if isinstance(event, Partial):
            self._latencies["partial"].append(latency_ms)
            self.metrics.partial_latency.observe(latency_ms / 1000)
            return PartialMessage(*fields, latency_ms=latency_ms)
        self._latencies["final"].append(latency_ms)
        self.metrics.final_latency.observe(latency_ms / 1000)
        return FinalMessage(*fields, latency_ms=latency_ms, seq=item.seq)

    def _oldest_audio_end(self) -> int:
        """A lower bound of the ``audio_end`` of every transcript still to be made: the windows still to decode end
        after their channel's buffered audio starts (made transcripts carry their arrival time)."""
        return min((c.core.buffer_start for c in self.channels), default=0) - _ARRIVALS_MARGIN

    async def _close_after_sending(self, sender: asyncio.Task[None], code: int, reason: str) -> None:
        """Close with ``code`` once everything queued went out, or after ``flush_timeout`` if the reader stalls."""
        self._outbox.put(_Close(code, reason))
        try:
            async with asyncio.timeout(self.options.flush_timeout):
                await sender
        except TimeoutError:
            logger.warning("session=%s event=send_timeout unsent=%d", self.id, len(self._outbox.items))
        await self.ws.close(code, reason)  # idempotent when the sender already closed

    async def _send_now(self, message: ServerMessage) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(serialize(message))


class _Gone(ProtocolError):
    """The client closed the connection or it broke: nothing more can be sent."""

    code = "gone"

    def __init__(self) -> None:
        super().__init__("the connection is closed")


def _bound_socket_send_buffer(ws: ServerConnection, size: int) -> None:
    sock = ws.transport.get_extra_info("socket")
    if size > 0 and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


def _seconds(samples: int) -> float:
    return round(samples / SAMPLE_RATE, 4)


def _word(word: Word) -> WordMessage:
    return WordMessage(word.text, _seconds(word.start), _seconds(word.end), round(word.probability, 4))


class Resumption:
    """A connection to ``/v1/listen?resume=<session_id>&last_seq=<n>``: claims the parked session from the registry
    and attaches to it, or refuses with ``unknown_session`` (close 4404). The server serves it like a session."""

    def __init__(self, ws: ServerConnection, registry: ResumeRegistry) -> None:
        self.ws = ws
        # who is asking (set by the server's runner): only the session's owner may claim it
        self.owner: Principal = ANONYMOUS
        self.registry = registry
        self.session: Session | None = None
        self._shut_down = False

    async def run(self) -> None:
        """Claim, then serve as :meth:`Session.resume`. Never raises (but propagates cancellation)."""
        # 1. Which session, from which final on? A malformed request or an unknown session is refused.
        try:
            request = parse_resume_query(self.ws.request.path if self.ws.request else "")
            if request is None:
                raise UnknownSession("no resume parameter")
            if self._shut_down:
                raise ServerShutdown("the server is shutting down")
            claimed = self.registry.claim(request.session_id, request.last_seq, self.owner)
            assert isinstance(claimed, Session)  # the registry holds only sessions
        except ProtocolError as refusal:
            logger.info("event=resume_refused code=%s reason=%r", refusal.code, refusal.message)
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(serialize(ErrorMessage(code=refusal.code, message=refusal.message)))
            await self.ws.close(refusal.close_code, refusal.code)
            return
        # 2. Serve this connection as the session's own.
        self.session = claimed
        await claimed.resume(self.ws, request.last_seq)

    def shutdown(self) -> None:
        """The server is going down: the resumed session flushes and closes with 1001 like any other."""
        self._shut_down = True
        if self.session is not None:
            self.session.shutdown()


def open_listen_session(
    ws: ServerConnection,
    scheduler: Scheduler,
    core_options: CoreOptions,
    options: SessionOptions,
    model: str,
    metrics: ServerMetrics,
    registry: ResumeRegistry,
) -> Session | Resumption:
    """What serves a ``/v1/listen`` connection: a :class:`Resumption` when its query names a session to resume,
    else a new :class:`Session` that may park in ``registry`` if its connection drops."""
    assert ws.request is not None
    if any(key == "resume" for key, _ in parse_qsl(urlsplit(ws.request.path).query)):
        return Resumption(ws, registry)
    return Session(ws, scheduler, core_options, options, model, metrics, registry)
