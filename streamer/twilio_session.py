"""One ``/twilio`` connection: a Twilio Media Stream in, a call's transcript events out to the hub.

Plumbing only, like :mod:`streamer.session`: frames are parsed and placed on each track's clock by
:class:`~streamer.twilio.CallTimeline`, each track (inbound = customer, outbound = agent) is transcribed by its own
core through a :class:`~streamer.pipeline.Transcriber`, and every event is published to the
:class:`~streamer.hub.CallHub` under the call's ``callSid``, where ``/v1/calls/{callSid}/events`` followers and the
delivery sinks pick it up. Nothing is sent back to Twilio: a Media Stream is one-way, and Twilio ignores other
messages.

Signature validation happens before the handshake, in the server's router (:func:`check_signature`): a request
without a valid ``X-Twilio-Signature`` gets HTTP 403 and never reaches this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request

from streamer.auth import ANONYMOUS, Principal
from streamer.core import CoreOptions
from streamer.errors import ConfigError, IdleTimeout, InternalError, MalformedMessage, ProtocolError, ServerShutdown
from streamer.events import Event, Final, Lost, Partial, SpeechStarted
from streamer.hub import CallEvent, CallEventType, CallHub
from streamer.pipeline import Transcriber
from streamer.ratelimit import AudioRateLimiter, RateLimitOptions
from streamer.scheduler import Scheduler
from streamer.session import new_session_id
from streamer.twilio import (
    TWILIO_RATE,
    CallTimeline,
    Media,
    PlacedAudio,
    Start,
    Stop,
    TrackName,
    parse_message,
    signature_matches,
)
from streamer.units import samples_to_seconds

__all__ = ["TwilioOptions", "TwilioSession", "check_signature"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TwilioOptions:
    """The ``/twilio`` endpoint. Validated in :meth:`validate`."""

    # the account's auth token; when set, every handshake must carry a valid X-Twilio-Signature (else HTTP 403)
    auth_token: str | None = None
    # the public base URL Twilio connects to (wss://calls.example.com), when a proxy rewrites Host or scheme; by
    # default the URL is rebuilt from the Host header with the wss scheme
    public_url: str | None = None
    # seconds without any message (Twilio sends media continuously, silence included) before the call is dropped
    idle_timeout: float = 10.0
    # seconds to wait for the last finals once the stream stopped
    flush_timeout: float = 20.0
    # how fast each track's audio may arrive: the server's one audio rate limit (SessionOptions.rate_limit, which
    # the server puts here); Twilio sends real time, so only a forged or replayed stream trips it
    rate_limit: RateLimitOptions = field(default_factory=RateLimitOptions)

    def validate(self) -> None:
        """Raise :class:`~streamer.errors.ConfigError` naming the first invalid field."""
        if self.auth_token is not None and not self.auth_token:
            raise ConfigError("the Twilio auth token must not be empty")
        if self.public_url is not None and not self.public_url.startswith(("ws://", "wss://", "http://", "https://")):
            raise ConfigError("the Twilio public URL must start with wss:// (or ws://, https://, http://)")
        if self.idle_timeout <= 0 or self.flush_timeout <= 0:
            raise ConfigError("Twilio timeouts must be > 0")
        self.rate_limit.validate()


def signed_url(options: TwilioOptions, request: Request) -> str:
    """The URL Twilio signed for this request: the public base (or ``wss://`` + Host) + the request target."""
    base = options.public_url or f"wss://{request.headers.get('Host', '')}"
    return base.rstrip("/") + request.path


def check_signature(options: TwilioOptions, request: Request) -> str | None:
    """None when the request may go on; else why it must be refused (HTTP 403)."""
    if options.auth_token is None:
        return None
    signature = request.headers.get("X-Twilio-Signature")
    if signature is None:
        return "missing X-Twilio-Signature"
    if not signature_matches(options.auth_token, signed_url(options, request), signature):
        return "invalid X-Twilio-Signature"
    return None


class TwilioSession:
    """Serve one Media Stream; :meth:`run` is the whole story, :meth:`shutdown` cuts it short."""

    def __init__(
        self,
        ws: ServerConnection,
        scheduler: Scheduler,
        core_options: CoreOptions,
        options: TwilioOptions,
        hub: CallHub,
    ) -> None:
        self.id = new_session_id()
        # who opened the stream (set by the server's runner)
        self.owner: Principal = ANONYMOUS
        self.ws = ws
        self.scheduler = scheduler
        self.core_options = core_options
        self.options = options
        self.hub = hub
        self.timeline = CallTimeline()
        self.transcriber: Transcriber | None = None
        self.call_sid: str | None = None
        # one audio rate limiter per track (Twilio sends each track at real time)
        self._limiters: dict[str, AudioRateLimiter] = {}
        self._stop: asyncio.Future[ProtocolError] = asyncio.get_running_loop().create_future()

    async def run(self) -> None:
        """Serve the stream until ``stop``, a close, or an error. Never raises (but propagates cancellation)."""
        log = f"twilio={self.id}"
        # 1. The signature, the origin and the admission slot were the runner's (streamer.routes).
        error: ProtocolError | None = None
        try:
            # 2. Receive until stop, a close, a malformed message, idleness or shutdown.
            error = await self._receive_until_stop()
            # 3. Flush: the last finals of every track reach the hub before call_ended.
            if self.transcriber is not None:
                if not await self.transcriber.drain(self.options.flush_timeout):
                    logger.warning("%s event=flush_timeout call=%s", log, self.call_sid)
                self._publish_end(error)
            # 4. Close: 1000 after stop, else the error's code.
            code, reason = (1000, "stopped") if error is None else (error.close_code, error.code)
            with contextlib.suppress(ConnectionClosed):
                await self.ws.close(code, reason)
            logger.info("%s event=closed call=%s code=%s", log, self.call_sid, code)
        finally:
            # 5. Let go of the scheduler, whatever happened.
            if self.transcriber is not None:
                self.transcriber.close()

    def shutdown(self) -> None:
        """The server is stopping: stop receiving, flush the finals, then close with 1001."""
        if not self._stop.done():
            self._stop.set_result(ServerShutdown("the server is shutting down"))

    # -- receiving --------------------------------------------------------------------------------------------------

    async def _receive_until_stop(self) -> ProtocolError | None:
        try:
            while True:
                frame = await self._next_frame()
                if frame is None:
                    return None  # Twilio hung up without stop: the call is over all the same
                message = parse_message(frame)
                if message is None:
                    continue
                placed = self.timeline.receive(message)
                if isinstance(message, Start):
                    self._start(message)
                elif isinstance(message, Stop):
                    return None
                elif placed is not None and self.transcriber is not None and isinstance(message, Media):
                    now = time.monotonic()
                    # charged before any work, gap silence included (4429 rate_limited past the limit)
                    limiter = self._limiters.get(placed.track.value)
                    if limiter is None:
                        limiter = self._limiters[placed.track.value] = AudioRateLimiter(self.options.rate_limit, now)
                    limiter.receive(len(placed.samples), TWILIO_RATE, now)
                    if placed.gap_samples:
                        self._publish_gap(placed)
                    self.transcriber.feed(placed.track.value, placed.samples, now)
        except ProtocolError as error:
            logger.info("twilio=%s event=error code=%s reason=%r", self.id, error.code, error.message)
            return error
        except Exception:
            logger.exception("twilio=%s event=internal_error", self.id)
            return InternalError("internal server error")

    async def _next_frame(self) -> str | bytes | None:
        receiving: asyncio.Future[Any] = asyncio.ensure_future(self.ws.recv())
        done, _ = await asyncio.wait(
            {receiving, self._stop}, timeout=self.options.idle_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if receiving in done:
            try:
                frame: str | bytes = receiving.result()
            except ConnectionClosed:
                return None
            return frame
        receiving.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
            await receiving
        if self._stop.done():
            raise self._stop.result()
        raise IdleTimeout(f"no Twilio message for {self.options.idle_timeout:g} s")

    def _start(self, start: Start) -> None:
        if self.hub.has_started(start.call_sid):
            # a call's events are one sequence from call_started to call_ended: a second stream cannot join it
            raise MalformedMessage(f"call {start.call_sid} is already streaming or has ended")
        self.call_sid = start.call_sid
        self.transcriber = Transcriber(
            self.scheduler,
            self.core_options,
            f"{self.id}/{start.call_sid}",
            tuple(t.value for t in start.tracks),
            TWILIO_RATE,
            self._on_event,
        )
        data: dict[str, Any] = {
            "stream_sid": start.stream_sid,
            "account_sid": start.account_sid,
            "tracks": {t.value: t.label for t in start.tracks},
            "custom_parameters": dict(start.custom_parameters),
        }
        self.hub.publish(CallEvent(CallEventType.CALL_STARTED, start.call_sid, data=data))
        logger.info("twilio=%s event=start call=%s tracks=%s", self.id, start.call_sid, ",".join(data["tracks"]))

    # -- publishing -------------------------------------------------------------------------------------------------

    def _on_event(self, track: str, event: Event) -> None:
        assert self.call_sid is not None
        label = TrackName(track).label
        base = CallEvent(CallEventType.FINAL, self.call_sid, track=track, label=label)
        if isinstance(event, SpeechStarted):
            published = dataclasses.replace(
                base, type=CallEventType.SPEECH_STARTED, start=round(samples_to_seconds(event.start), 3)
            )
        elif isinstance(event, Partial | Final):
            if isinstance(event, Final) and not event.text.strip():
                return  # audio accounted without words: nothing for a follower to show
            published = dataclasses.replace(
                base,
                type=CallEventType.FINAL if isinstance(event, Final) else CallEventType.PARTIAL,
                segment_id=event.segment_id,
                text=event.text.strip(),
                start=round(samples_to_seconds(event.start), 3),
                end=round(samples_to_seconds(event.end), 3),
            )
        elif isinstance(event, Lost):
            logger.warning("twilio=%s event=lost call=%s track=%s", self.id, self.call_sid, track)
            published = dataclasses.replace(
                base,
                type=CallEventType.GAP,
                start=round(samples_to_seconds(event.start), 3),
                end=round(samples_to_seconds(event.end), 3),
                data={"reason": "engine_failure"},
            )
        else:
            return
        self.hub.publish(published)

    def _publish_gap(self, placed: PlacedAudio) -> None:
        assert self.call_sid is not None
        start, end = placed.start, placed.start + placed.gap_samples
        logger.warning(
            "twilio=%s event=gap call=%s track=%s ms=%d", self.id, self.call_sid, placed.track, (end - start) // 8
        )
        self.hub.publish(
            CallEvent(
                CallEventType.GAP,
                self.call_sid,
                track=placed.track.value,
                label=placed.track.label,
                start=round(start / TWILIO_RATE, 3),
                end=round(end / TWILIO_RATE, 3),
                data={"reason": "missing_media"},
            )
        )

    def _publish_end(self, error: ProtocolError | None) -> None:
        assert self.call_sid is not None
        stats = {track.value: dataclasses.asdict(s) for track, s in self.timeline.stats.items()}
        data: dict[str, Any] = {"tracks": stats, "reason": "stopped" if error is None else error.code}
        self.hub.publish(CallEvent(CallEventType.CALL_ENDED, self.call_sid, data=data))
