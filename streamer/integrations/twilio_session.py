"""One ``/twilio`` connection: a Twilio Media Stream in, a call's transcript events out to the hub.

The endpoint's sans-I/O adapter (:mod:`streamer.server.adapter`), driven by the server's connection runner: frames are
parsed and placed on each track's clock by :class:`~streamer.integrations.twilio.CallTimeline`, each track (inbound =
customer, outbound = agent, or the labels of the stream's ``customParameters``) is transcribed by its own core through
a :class:`~streamer.integrations.transcriber.Transcriber`, and every event (transcripts, gaps, ``dtmf`` keys, ``mark``
names) is published to the :class:`~streamer.integrations.hub.CallHub` under the call's ``callSid`` through the
stream's place in its call (:class:`~streamer.integrations.twilio_calls.CallStream`: a call may have several streams),
where ``/v1/calls/{callSid}/events`` followers and the delivery sinks pick it up. Nothing is sent back to Twilio: a
Media Stream is one-way, and Twilio ignores other messages.

Signature validation happens before the handshake, in the server's router (:func:`check_signature`): a request
without a valid ``X-Twilio-Signature`` gets HTTP 403 and never reaches this module.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from websockets.http11 import Request

from streamer.core.errors import ConfigError, IdleTimeout, InternalError, MalformedMessage, ProtocolError
from streamer.core.events import Event, Final, Lost, Partial, SpeechStarted
from streamer.core.options import CoreOptions
from streamer.core.units import samples_to_seconds
from streamer.integrations.hub import CallEvent, CallEventType
from streamer.integrations.transcriber import Transcriber, TranscribingAdapter
from streamer.integrations.twilio import (
    TWILIO_RATE,
    CallTimeline,
    Dtmf,
    Mark,
    Media,
    PlacedAudio,
    Start,
    Stop,
    TrackName,
    parse_message,
    signature_matches,
    track_labels,
)
from streamer.integrations.twilio_calls import CallStream, TwilioCalls
from streamer.server.adapter import session_log
from streamer.server.lifecycle import Phase, StreamLimits
from streamer.server.ratelimit import AudioRateLimiter, RateLimitOptions
from streamer.server.scheduler import Scheduler
from streamer.server.session_options import new_session_id

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
    # once the stream stopped, seconds the engine may go without progress before the stream gives up on the rest
    # (FlushBound): the server's one flush bound (SessionOptions.flush_timeout, which the server puts here)
    flush_timeout: float = 10.0
    # seconds a call whose last stream ended waits for another before call_ended: covers <Stop><Stream> then
    # <Start><Stream>, a track streamed on its own connection that starts late, the leg after a transfer
    # (streamer.integrations.twilio_calls); 0 ends the call with its last stream
    call_end_grace: float = 5.0
    # how fast each track's audio may arrive: the server's one audio rate limit (SessionOptions.rate_limit, which
    # the server puts here); Twilio sends real time, so only a forged or replayed stream trips it
    rate_limit: RateLimitOptions = field(default_factory=RateLimitOptions)

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.auth_token is not None and not self.auth_token:
            raise ConfigError("the Twilio auth token must not be empty")
        if self.public_url is not None and not self.public_url.startswith(("ws://", "wss://", "http://", "https://")):
            raise ConfigError("the Twilio public URL must start with wss:// (or ws://, https://, http://)")
        if self.idle_timeout <= 0 or self.flush_timeout <= 0:
            raise ConfigError("Twilio timeouts must be > 0")
        if self.call_end_grace < 0:
            raise ConfigError("the Twilio call_end_grace must be >= 0")
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


class TwilioSession(TranscribingAdapter):
    """One Media Stream, sans-I/O (:mod:`streamer.server.adapter`), opened at ``now``, a stream of a call in
    ``calls``. It ends with close 1000 after ``stop`` or a hang-up, or the error's code (4400 malformed, 4408 idle,
    4409 a track its call streams already, 4429 rate limited, 1001 shutdown), once every final the audio allows
    reached the hub (while the engine makes progress on it: ``flush_timeout``), then ``stream_ended`` (and
    ``call_ended`` when no other stream of the call follows)."""

    kind = "twilio"

    def __init__(
        self,
        scheduler: Scheduler,
        core_options: CoreOptions,
        options: TwilioOptions,
        calls: TwilioCalls,
        now: float,
    ) -> None:
        super().__init__(StreamLimits(options.idle_timeout, options.flush_timeout), now)
        self.id = new_session_id()
        self._log = session_log(logger, self.id)
        self.scheduler = scheduler
        self.core_options = core_options
        self.options = options
        self.calls = calls
        self.timeline = CallTimeline()
        self.call_sid: str | None = None
        self.stream: CallStream | None = None  # the stream's place in its call, once started
        # one audio rate limiter per track (Twilio sends each track at real time)
        self._limiters: dict[str, AudioRateLimiter] = {}

    # -- inputs (the timer, shutdown and the flush are TranscribingAdapter's) --------------------------------------

    def receive_text(self, frame: str, now: float) -> None:
        self._receive(frame, now)

    def receive_bytes(self, frame: bytes, now: float) -> None:
        self._receive(frame, now)  # refused as malformed: Twilio sends text

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        self._end(None, now)  # Twilio hung up without stop: the call is over all the same

    # -- the story --------------------------------------------------------------------------------------------------

    def _receive(self, frame: str | bytes, now: float) -> None:
        if not self._note_frame(now):
            return
        try:
            message = parse_message(frame)
            if message is None:
                return
            placed = self.timeline.receive(message)
            if self.call_sid is not None and self.calls.hub.claimed_elsewhere(self.call_sid):
                # another replica holds this call: a second stream of it (a replay) stops here too
                raise MalformedMessage(f"call {self.call_sid} is already streaming on another replica")
            if isinstance(message, Start):
                self._start(message, now)
            elif isinstance(message, Stop):
                self._end(None, now)
            elif isinstance(message, Dtmf | Mark):
                self._publish_signal(message)
            elif placed is not None and self.transcriber is not None and isinstance(message, Media):
                # charged before any work, gap silence included (4429 rate_limited past the limit)
                limiter = self._limiters.get(placed.track.value)
                if limiter is None:
                    limiter = self._limiters[placed.track.value] = AudioRateLimiter(self.options.rate_limit, now)
                limiter.receive(len(placed.samples), TWILIO_RATE, now)
                if placed.gap_samples:
                    self._publish_gap(placed)
                self.transcriber.feed(placed.track.value, placed.samples, now)
        except ProtocolError as error:
            self._log.info("twilio=%s event=error code=%s reason=%r", self.id, error.code, error.message)
            self._end(error, now)
        except Exception:
            self._log.exception("twilio=%s event=internal_error", self.id)
            self._end(InternalError("internal server error"), now)

    def release(self) -> None:
        """Let go of the scheduler. A stream whose story was cut short (its run cancelled before :meth:`_finish`)
        still ends in its call, or the call would wait for it, and refuse its tracks, for ever."""
        if self.stream is not None and not self.stream.ended:
            self.stream.end("stopped" if self._error is None else self._error.code, self.timeline.stats)
        super().release()

    def _idle_error(self) -> IdleTimeout:
        return IdleTimeout(f"no Twilio message for {self.limits.idle_timeout:g} s")

    def _finish(self) -> None:
        """call_ended, then the close: 1000 after stop, else the error's code."""
        self.phase = Phase.CLOSED
        error = self._error
        if self.stream is not None:
            self.stream.end("stopped" if error is None else error.code, self.timeline.stats)
        code, reason = (1000, "stopped") if error is None else (error.close_code, error.code)
        self._log.info("twilio=%s event=closed call=%s code=%s", self.id, self.call_sid, code)
        self._close_with(code, reason)

    def _start(self, start: Start, now: float) -> None:
        labels = track_labels(start)
        self.stream = self.calls.open(start, labels, now)  # refused when its call streams one of its tracks already
        self.call_sid = start.call_sid
        self.transcriber = Transcriber(
            self.scheduler,
            self.core_options,
            f"{self.id}/{start.call_sid}",
            tuple(t.value for t in start.tracks),
            TWILIO_RATE,
            self._on_event,
            self._after_events,
        )
        self._log.info(
            "twilio=%s event=start call=%s stream=%s tracks=%s offset_s=%.3f",
            self.id,
            start.call_sid,
            start.stream_sid,
            ",".join(f"{t.value}:{label}" for t, label in labels.items()),
            self.stream.offset,
        )

    # -- publishing -------------------------------------------------------------------------------------------------

    def _on_event(self, track: str, event: Event) -> None:
        assert self.stream is not None and self.call_sid is not None
        base = CallEvent(CallEventType.FINAL, self.call_sid, track=track, label=self.stream.label(TrackName(track)))
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
            self._log.warning("twilio=%s event=lost call=%s track=%s", self.id, self.call_sid, track)
            published = dataclasses.replace(
                base,
                type=CallEventType.GAP,
                start=round(samples_to_seconds(event.start), 3),
                end=round(samples_to_seconds(event.end), 3),
                data={"reason": "engine_failure"},
            )
        else:
            return
        self.stream.publish(published)

    def _publish_gap(self, placed: PlacedAudio) -> None:
        assert self.stream is not None and self.call_sid is not None
        start, end = placed.start, placed.start + placed.gap_samples
        self._log.warning(
            "twilio=%s event=gap call=%s track=%s ms=%d", self.id, self.call_sid, placed.track, (end - start) // 8
        )
        self.stream.publish(
            CallEvent(
                CallEventType.GAP,
                self.call_sid,
                track=placed.track.value,
                label=self.stream.label(placed.track),
                start=round(start / TWILIO_RATE, 3),
                end=round(end / TWILIO_RATE, 3),
                data={"reason": "missing_media"},
            )
        )

    def _publish_signal(self, message: Dtmf | Mark) -> None:
        """A key pressed on a track (``dtmf``), or Twilio's word that audio sent to the call up to a ``mark`` has
        played: published at the stream's position, the end of the audio so far (of the digit's track)."""
        if self.stream is None or self.call_sid is None:
            raise MalformedMessage(f"Twilio sent {type(message).__name__.lower()} before start")
        placed = self.timeline.stats
        if isinstance(message, Dtmf):
            at = placed[message.track].samples if message.track in placed else max(s.samples for s in placed.values())
            event = CallEvent(
                CallEventType.DTMF,
                self.call_sid,
                track=message.track.value,
                label=self.stream.label(message.track),
                start=round(at / TWILIO_RATE, 3),
                data={"digit": message.digit},
            )
        else:
            at = max(s.samples for s in placed.values())
            event = CallEvent(
                CallEventType.MARK, self.call_sid, start=round(at / TWILIO_RATE, 3), data={"name": message.name}
            )
        self.stream.publish(event)
