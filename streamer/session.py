"""One ``/v1/listen`` connection: plumbing between the WebSocket, the stream cores and the scheduler.

The session decides nothing about transcription. It decodes binary frames (:class:`~streamer.audio.WireDecoder`),
resamples each channel to 16 kHz, feeds one :class:`~streamer.core.StreamCore` per channel with
``now=time.monotonic()`` (the only place that reads the clock), lets the :class:`~streamer.scheduler.Scheduler`
run the windows the cores ask for, and turns core events into protocol messages. It also enforces the limits:
frame size, idle timeout, session length and a bounded send buffer for slow readers.

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
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, NewType

import numpy as np
import numpy.typing as npt
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from streamer.audio import Resampler, WireDecoder
from streamer.core import CoreOptions, StreamCore
from streamer.engine.types import DecodeRequest, DecodeResult, StreamId
from streamer.errors import (
    ConfigError,
    EngineFailure,
    FrameTooLarge,
    IdleTimeout,
    InternalError,
    ProtocolError,
    ServerShutdown,
    SessionTooLong,
    SlowReader,
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
    LostRange,
    PartialMessage,
    Percentiles,
    Ready,
    ServerMessage,
    SpeechStartedMessage,
    WordMessage,
    parse_client_message,
    parse_listen_query,
    serialize,
)
from streamer.scheduler import Scheduler
from streamer.status import SessionSnapshot, latency_percentiles
from streamer.units import SAMPLE_RATE, samples_to_seconds

__all__ = ["Session", "SessionId", "SessionOptions", "SessionState", "new_session_id"]

logger = logging.getLogger(__name__)

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
    # seconds to wait for the engine to finish the last windows when a session ends; the rest is reported lost
    flush_timeout: float = 10.0

    def validate(self) -> None:
        """Raise :class:`~streamer.errors.ConfigError` naming the first invalid field."""
        if self.max_frame_bytes < 4:
            raise ConfigError("max_frame_bytes must be at least 4")
        for name in ("idle_timeout", "max_session_seconds", "flush_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if self.send_buffer < 2:
            raise ConfigError("send_buffer must be at least 2")


class SessionState(Enum):
    CONNECTING = "connecting"  # handshake done; query and admission not yet checked
    STREAMING = "streaming"  # ready sent; audio flows
    DRAINING = "draining"  # no more audio; waiting for the last finals
    CLOSED = "closed"


class _Channel:
    """One channel of a session: its resampler, its core, and what it has accounted for. The scheduler's
    :class:`~streamer.scheduler.DecodeClient` for that core."""

    def __init__(self, session: Session, index: int, core: StreamCore, sample_rate: int) -> None:
        self.session = session
        self.index = index
        self.core = core
        self.resampler = Resampler(sample_rate, SAMPLE_RATE)
        self._stream_id = StreamId(f"{session.id}/{index}")
        # accounted samples (stream time), and the spans accounted, to name what is missing if we give up waiting
        self.transcribed = 0
        self.non_speech = 0
        self.lost = 0
        self.spans: list[tuple[int, int]] = []
        self.offered = False  # whether the core may have a window ready that the scheduler has not taken

    @property
    def stream_id(self) -> StreamId:
        return self._stream_id

    def has_work(self) -> bool:
        return self.offered

    def windows_to_decode(self) -> list[DecodeRequest]:
        self.offered = False
        return self.core.windows_to_decode()

    def receive_decode_result(self, result: DecodeResult) -> None:
        self.core.receive_decode_result(result, now=time.monotonic())
        self.offered = True  # the core may have held the next window back until this result
        self.session.after_core_update()

    def receive_decode_failure(self, request_id: int, reason: str) -> None:
        self.core.receive_decode_failure(request_id, reason, now=time.monotonic())
        self.offered = True
        self.session.after_core_update()

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
    """Serve one connection from handshake to close; :meth:`run` is the whole story, :meth:`shutdown` cuts it short.

    Construct in the server's connection handler and ``await run()``; it never raises except on cancellation.
    """

    def __init__(
        self,
        ws: ServerConnection,
        scheduler: Scheduler,
        core_options: CoreOptions,
        options: SessionOptions,
        model: str,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.id = new_session_id()
        self.ws = ws
        self.scheduler = scheduler
        self.core_options = core_options
        self.options = options
        self.model = model
        self.metrics = metrics if metrics is not None else scheduler.metrics
        self.state = SessionState.CONNECTING
        self.channels: list[_Channel] = []
        self._decoder: WireDecoder | None = None
        self._outbox = _Outbox(options.send_buffer)
        # why the session must stop early (server shutdown, slow reader); set once, by shutdown() or the outbox
        self._stop: asyncio.Future[ProtocolError] = asyncio.get_running_loop().create_future()
        self._all_done = asyncio.Event()
        # arrival time of audio: after _arrived_samples[i] samples (16 kHz, per channel) arrived at _arrived_at[i]
        self._arrived_samples: list[int] = []
        self._arrived_at: list[float] = []
        self._latencies: dict[str, list[float]] = {"partial": [], "final": []}
        self._opened = time.monotonic()
        self._last_frame = self._opened

    # -- the story --------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it closes. Never raises (but propagates cancellation)."""
        log = f"session={self.id}"
        # 1. What did the client ask for, and is there room for it? Either failure is an error, then a close.
        try:
            params = parse_listen_query(self.ws.request.path if self.ws.request else "")
            self.scheduler.admit(self.id)
        except ProtocolError as rejection:
            logger.info("%s event=rejected code=%s reason=%r", log, rejection.code, rejection.message)
            await self._send_now(ErrorMessage(code=rejection.code, message=rejection.message))
            await self.ws.close(rejection.close_code, rejection.code)
            self.state = SessionState.CLOSED
            return
        sender = asyncio.create_task(self._send_loop(), name=f"session-{self.id}-send")
        try:
            # 2. One core per channel, each registered with the scheduler; then tell the client we are ready.
            self._decoder = WireDecoder(params.audio_format)
            core_options = self.core_options
            if params.language is not None:
                core_options = replace(core_options, decode=replace(core_options.decode, language=params.language))
            for index in range(params.channels):
                core = StreamCore(core_options, StreamId(f"{self.id}/{index}"))
                self.channels.append(_Channel(self, index, core, params.sample_rate))
            for channel in self.channels:
                self.scheduler.register(channel)
            self._put(
                Ready(
                    session_id=self.id,
                    model=self.model,
                    sample_rate=params.sample_rate,
                    encoding=params.encoding.value,
                    channels=params.channels,
                )
            )
            self.state = SessionState.STREAMING
            logger.info(
                "%s event=open encoding=%s sample_rate=%d channels=%d language=%s",
                log,
                params.encoding.value,
                params.sample_rate,
                params.channels,
                params.language,
            )
            # 3. Receive until the client ends the stream, breaks a rule, goes away, or the server stops us.
            error = await self._receive_until_end()
            # 4. Whatever the reason, flush: every final the cores can still produce goes out before the close.
            if not isinstance(error, (SlowReader, _Gone)):
                await self._drain()
            # 5. The last word: done after a clean end, else the error; then the close code that goes with it.
            if isinstance(error, _Gone):
                logger.info("%s event=gone code=%s", log, self.ws.close_code)
            elif error is None:
                self._put(self._done_message())
                await self._close_after_sending(sender, 1000, "done")
            else:
                if isinstance(error, SlowReader):
                    self._outbox.items.clear()  # nothing queued can reach this reader in time; say why instead
                self._put(ErrorMessage(code=error.code, message=error.message))
                await self._close_after_sending(sender, error.close_code, error.code)
            logger.info(
                "%s event=closed code=%s received_s=%.2f dropped_partials=%d",
                log,
                self.ws.close_code,
                sum(samples_to_seconds(c.core.samples_received) for c in self.channels),
                self._outbox.dropped_partials,
            )
        finally:
            # 6. Let go of everything, whatever happened above.
            self.state = SessionState.CLOSED
            sender.cancel()
            for channel in self.channels:
                self.scheduler.unregister(channel)
            self.scheduler.release(self.id)

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
        assert self._decoder is not None
        per_channel = self._decoder.decode(frame)
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
            self._arrived_samples.append(channel.core.samples_received)
            self._arrived_at.append(now)

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
            self._put(_Transcript(channel.index, event))
        elif isinstance(event, Final):
            channel.transcribed += event.end - event.start
            channel.account(event.start, event.end)
            self.metrics.audio_transcribed.inc(samples_to_seconds(event.end - event.start))
            self._put(_Transcript(channel.index, event))
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
                    await self.ws.send(serialize(self._render(item)))
                outbox.ready.clear()
        except ConnectionClosed:
            self._fail(_Gone())

    def _render(self, item: ServerMessage | _Transcript) -> ServerMessage:
        if not isinstance(item, _Transcript):
            return item
        event = item.event
        latency_ms = self._latency_ms(event.audio_end, time.monotonic())
        words = tuple(_word(w) for w in event.words)
        fields = (item.channel, event.segment_id, event.text, _seconds(event.start), _seconds(event.end), words)
        if isinstance(event, Partial):
            self._latencies["partial"].append(latency_ms)
            self.metrics.partial_latency.observe(latency_ms / 1000)
            return PartialMessage(*fields, latency_ms=latency_ms)
        self._latencies["final"].append(latency_ms)
        self.metrics.final_latency.observe(latency_ms / 1000)
        return FinalMessage(*fields, latency_ms=latency_ms)

    def _latency_ms(self, audio_end: int, now: float) -> float:
        """From the arrival of stream sample ``audio_end`` (the last one the text needed) to ``now``."""
        if not self._arrived_at:
            return 0.0
        index = min(bisect_left(self._arrived_samples, audio_end), len(self._arrived_at) - 1)
        return round(max(0.0, now - self._arrived_at[index]) * 1000, 1)

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


def _seconds(samples: int) -> float:
    return round(samples / SAMPLE_RATE, 4)


def _word(word: Word) -> WordMessage:
    return WordMessage(word.text, _seconds(word.start), _seconds(word.end), round(word.probability, 4))
