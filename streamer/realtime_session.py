"""One ``/v1/realtime?intent=transcription`` connection: OpenAI Realtime transcription events over one stream core.

Plumbing only: client events are parsed by :func:`~streamer.realtime.parse_client_event`, appended audio is
decoded, resampled and fed to a one-track :class:`~streamer.pipeline.Transcriber`, and its events become
conversation items through :class:`~streamer.realtime.Items`. A bad event gets an ``error`` event and the session
goes on, as with OpenAI; only a connection problem, the idle timeout or a server shutdown ends it.

The audio format and turn detection may change until the first audio is appended; the stream core is built then.

Appended audio is charged to the same :class:`~streamer.ratelimit.AudioRateLimiter` as ``/v1/listen``'s before it
is decoded. An append beyond the limit is refused with an ``error`` event (code ``rate_limited``) and dropped whole,
and the session goes on: audio accepted before it is transcribed as usual, and the client may append again once
the bucket has refilled (issue 14: 131 s were once accepted in one append).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from streamer.audio import AudioFormat, WireDecoder
from streamer.auth import ANONYMOUS, Principal
from streamer.core import CoreOptions
from streamer.errors import ConfigError, IdleTimeout, ProtocolError, RateLimited, ServerShutdown, SlowReader
from streamer.events import Event, Final, SpeechStarted
from streamer.pipeline import Transcriber
from streamer.ratelimit import AudioRateLimiter, RateLimitOptions
from streamer.realtime import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    InvalidRequest,
    Items,
    SessionUpdate,
    TranscriptionConfig,
    error_event,
    parse_client_event,
)
from streamer.scheduler import Scheduler

__all__ = ["RealtimeOptions", "RealtimeSession"]

logger = logging.getLogger(__name__)

_TRACK = "input"


@dataclass(frozen=True)
class RealtimeOptions:
    """The ``/v1/realtime`` endpoint. Validated in :meth:`validate`."""

    # seconds without any client event before the session is closed (4408)
    idle_timeout: float = 60.0
    # seconds to wait for the last transcripts when the server stops
    flush_timeout: float = 10.0
    # server events queued for a slow client before the session is closed (4408)
    send_buffer: int = 1024
    # how fast a client may append audio: the same limit as /v1/listen's (SessionOptions.rate_limit); an append
    # beyond it gets an error event rate_limited and is dropped whole
    rate_limit: RateLimitOptions = field(default_factory=RateLimitOptions)

    def validate(self) -> None:
        """Raise :class:`~streamer.errors.ConfigError` naming the first invalid field."""
        if self.idle_timeout <= 0 or self.flush_timeout <= 0:
            raise ConfigError("realtime timeouts must be > 0")
        if self.send_buffer < 16:
            raise ConfigError("realtime send_buffer must be at least 16")
        self.rate_limit.validate()


class RealtimeSession:
    """Serve one connection; :meth:`run` is the whole story, :meth:`shutdown` cuts it short."""

    def __init__(
        self,
        ws: ServerConnection,
        scheduler: Scheduler,
        core_options: CoreOptions,
        options: RealtimeOptions,
        beta: bool,
    ) -> None:
        self.id = f"sess_{secrets.token_hex(8)}"
        # who opened the session (set by the server's runner)
        self.owner: Principal = ANONYMOUS
        self.ws = ws
        self.scheduler = scheduler
        self.core_options = core_options
        self.options = options
        self.beta = beta
        self.config = TranscriptionConfig()
        self.transcriber: Transcriber | None = None
        self.items = Items(server_vad=True)
        self._decoder: WireDecoder | None = None
        self._limiter = AudioRateLimiter(options.rate_limit, time.monotonic())
        self._outgoing: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._stop: asyncio.Future[ProtocolError] = asyncio.get_running_loop().create_future()

    async def run(self) -> None:
        """Serve until the client leaves or the server stops. Never raises (but propagates cancellation)."""
        # 1. Credentials, the origin and the admission slot were the runner's (streamer.routes).
        sender = asyncio.create_task(self._send_loop(), name=f"realtime-{self.id}-send")
        try:
            # 2. Say what the session is.
            created = "transcription_session.created" if self.beta else "session.created"
            self._send({"type": created, "event_id": self.items.event_id(), **self._session()})
            # 3. Events until the client goes away, idles out, or the server stops.
            reason = await self._receive()
            # 4. Going away on the server's side: flush what the core can still finish, then say why.
            if reason is not None:
                if self.transcriber is not None:
                    await self.transcriber.drain(self.options.flush_timeout)
                    self._send_all(self.items.end())
                error = InvalidRequest(reason.message, code=reason.code)
                self._send(error_event(self.items.event_id(), error, "server_error"))
                self._outgoing.put_nowait(None)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.options.flush_timeout):
                        await sender
                with contextlib.suppress(ConnectionClosed):
                    await self.ws.close(reason.close_code, reason.code)
        finally:
            # 5. Let go of everything.
            sender.cancel()
            if self.transcriber is not None:
                self.transcriber.close()

    def shutdown(self) -> None:
        """The server is stopping: finish the transcripts, then close with 1001."""
        if not self._stop.done():
            self._stop.set_result(ServerShutdown("the server is shutting down"))

    # -- receiving --------------------------------------------------------------------------------------------------

    async def _receive(self) -> ProtocolError | None:
        """Handle events; None when the client went away, else the reason the server ends the session."""
        while True:
            receiving: asyncio.Future[Any] = asyncio.ensure_future(self.ws.recv())
            done, _ = await asyncio.wait(
                {receiving, self._stop}, timeout=self.options.idle_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if receiving not in done:
                receiving.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                    await receiving
                if self._stop.done():
                    return self._stop.result()
                return IdleTimeout(f"no client event for {self.options.idle_timeout:g} s")
            try:
                frame = receiving.result()
            except ConnectionClosed:
                return None
            if self._stop.done():
                return self._stop.result()
            try:
                self._handle(parse_client_event(frame, self.config))
            except InvalidRequest as error:
                self._send(error_event(self.items.event_id(), error))

    def _handle(self, event: SessionUpdate | AudioAppend | AudioCommit | AudioClear) -> None:
        now = time.monotonic()
        if isinstance(event, SessionUpdate):
            if self.transcriber is not None and _audio_fields(event.config) != _audio_fields(self.config):
                raise InvalidRequest(
                    "the audio format and turn detection cannot change once audio was appended", param="session"
                )
            self.config = event.config
            updated = "transcription_session.updated" if event.beta else "session.updated"
            self._send({"type": updated, "event_id": self.items.event_id(), **self._session(event.beta)})
        elif isinstance(event, AudioAppend):
            fmt = self.config.format
            try:
                # charged before decoding, whole samples, as on /v1/listen: a refused append costs neither decoding
                # nor engine time, and is dropped whole (a partial one would leave a hole in the stream)
                self._limiter.receive(len(event.audio) // fmt.encoding.bytes_per_sample, fmt.sample_rate, now)
            except RateLimited as refusal:
                error = InvalidRequest(refusal.message, code=refusal.code, param="audio")
                error.event_id = event.event_id
                raise error from None
            transcriber = self._transcriber()
            assert self._decoder is not None
            transcriber.feed(_TRACK, self._decoder.decode(event.audio)[0], now)
        elif isinstance(event, AudioCommit | AudioClear):
            transcriber = self._transcriber()
            track = transcriber.track(_TRACK)
            point = track.core.samples_received
            if isinstance(event, AudioCommit):
                events = self.items.commit(point)  # raises before finalizing when the buffer is too small
                transcriber.finalize(_TRACK, now)
            else:
                transcriber.finalize(_TRACK, now)
                events = self.items.clear(point)
            self._send_all(events)
            self._settle()

    def _transcriber(self) -> Transcriber:
        if self.transcriber is None:
            config = self.config
            decode = replace(self.core_options.decode, language=config.language or self.core_options.decode.language)
            core_options = replace(self.core_options, decode=decode, endpoint_ms=config.silence_duration_ms)
            fmt = AudioFormat(encoding=config.format.encoding, sample_rate=config.format.sample_rate, channels=1)
            self._decoder = WireDecoder(fmt)
            self.items = Items(server_vad=config.server_vad)
            self.transcriber = Transcriber(
                self.scheduler,
                core_options,
                self.id,
                (_TRACK,),
                fmt.sample_rate,
                self._on_event,
                self._settle,
            )
            logger.info(
                "realtime=%s event=audio format=%s server_vad=%s", self.id, config.format.value, config.server_vad
            )
        return self.transcriber

    # -- transcripts ------------------------------------------------------------------------------------------------

    def _on_event(self, track: str, event: Event) -> None:
        if isinstance(event, SpeechStarted):
            self._send_all(self.items.speech_started(event.start))
        elif isinstance(event, Final):
            self._send_all(self.items.final(event.start, event.end, event.text))

    def _settle(self) -> None:
        if self.transcriber is not None:
            self._send_all(self.items.settle(self.transcriber.track(_TRACK).core.uncommitted_from))

    # -- sending ----------------------------------------------------------------------------------------------------

    def _session(self, beta: bool | None = None) -> dict[str, Any]:
        return {"session": self.config.session_object(self.id, self.beta if beta is None else beta)}

    def _send_all(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self._send(event)

    def _send(self, event: dict[str, Any]) -> None:
        if self._outgoing.qsize() >= self.options.send_buffer:
            if not self._stop.done():
                self._stop.set_result(SlowReader(f"the client did not read {self.options.send_buffer} events"))
            return
        self._outgoing.put_nowait(event)

    async def _send_loop(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            while (event := await self._outgoing.get()) is not None:
                await self.ws.send(json.dumps(event))


def _audio_fields(config: TranscriptionConfig) -> tuple[object, ...]:
    return (config.format, config.server_vad, config.silence_duration_ms, config.language)
