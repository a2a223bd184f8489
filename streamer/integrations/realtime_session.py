"""One ``/v1/realtime?intent=transcription`` connection: OpenAI Realtime transcription events over one stream core.

The endpoint's sans-I/O adapter (:mod:`streamer.server.adapter`), driven by the server's connection runner: client
events are parsed by :func:`~streamer.integrations.realtime.parse_client_event`, appended audio is decoded, resampled
and fed to a one-track :class:`~streamer.integrations.transcriber.Transcriber`, and its events become conversation items
through :class:`~streamer.integrations.realtime.Items`. A bad event gets an ``error`` event and the session goes on, as
with OpenAI; only a connection problem, the idle timeout, a slow reader or a server shutdown ends it.

The audio format and turn detection may change until the first audio is appended; the stream core is built then.

Appended audio is charged to the same :class:`~streamer.server.ratelimit.AudioRateLimiter` as ``/v1/listen``'s before it
is decoded. An append beyond the limit is refused with an ``error`` event (code ``rate_limited``) and dropped whole,
and the session goes on: audio accepted before it is transcribed as usual, and the client may append again once
the bucket has refilled (issue 14: 131 s were once accepted in one append).
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from streamer.core.audio import AudioFormat, WireDecoder
from streamer.core.errors import ConfigError, IdleTimeout, ProtocolError, RateLimited, SlowReader, UnsupportedAudio
from streamer.core.events import EndReason, Event, Final, Lost, SpeechEnded, SpeechStarted
from streamer.core.options import CoreOptions
from streamer.engine.types import check_supported
from streamer.integrations.realtime import (
    DELAY_AGREEMENT,
    DELAY_MARGIN_FACTOR,
    AudioAppend,
    AudioClear,
    AudioCommit,
    InvalidRequest,
    SessionUpdate,
    TranscriptionConfig,
    error_event,
    parse_client_event,
)
from streamer.integrations.realtime_items import EventIds, Items
from streamer.integrations.transcriber import Transcriber, TranscribingAdapter
from streamer.server.adapter import LOST, SendLimits, session_log
from streamer.server.lifecycle import Phase, StreamLimits
from streamer.server.outbox import Outbox
from streamer.server.ratelimit import AudioRateLimiter, RateLimitOptions
from streamer.server.scheduler import Scheduler

__all__ = ["RealtimeOptions", "RealtimeSession"]

logger = logging.getLogger(__name__)

_TRACK = "input"


@dataclass(frozen=True)
class RealtimeOptions:
    """The ``/v1/realtime`` endpoint. Validated in :meth:`validate`."""

    # seconds without any client event before the session is closed (4408)
    idle_timeout: float = 60.0
    # once the session ends, seconds the engine may go without progress before it gives up on the rest (FlushBound):
    # the server's one flush bound (SessionOptions.flush_timeout, which the server puts here)
    flush_timeout: float = 10.0
    # server events queued for a slow client before the session is closed (4408)
    send_buffer: int = 1024
    # how fast a client may append audio: the same limit as /v1/listen's (SessionOptions.rate_limit); an append
    # beyond it gets an error event rate_limited and is dropped whole
    rate_limit: RateLimitOptions = field(default_factory=RateLimitOptions)

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.idle_timeout <= 0 or self.flush_timeout <= 0:
            raise ConfigError("realtime timeouts must be > 0")
        if self.send_buffer < 16:
            raise ConfigError("realtime send_buffer must be at least 16")
        self.rate_limit.validate()


class RealtimeSession(TranscribingAdapter):
    """One connection, sans-I/O (:mod:`streamer.server.adapter`), opened at ``now``. A bad event gets an ``error`` event
    and the session goes on; the idle timeout (4408), a slow reader (4408) or a shutdown (1001) end it after the
    last transcripts the audio allows (while the engine makes progress: ``flush_timeout``) and an ``error`` saying
    why; a client that leaves ends it at once. With server VAD and ``idle_timeout_ms``, :meth:`receive_timer` also
    sends ``input_audio_buffer.timeout_triggered`` once that long passes without speech."""

    kind = "realtime"

    def __init__(
        self,
        scheduler: Scheduler,
        core_options: CoreOptions,
        options: RealtimeOptions,
        beta: bool,
        now: float,
    ) -> None:
        super().__init__(StreamLimits(options.idle_timeout, options.flush_timeout), now)
        # the events a slow client has not read, at most send_buffer of them (none supersedes another)
        self._outgoing = Outbox(options.send_buffer, what="events")
        self.id = f"sess_{secrets.token_hex(8)}"
        self._log = session_log(logger, self.id)
        self.scheduler = scheduler
        self.core_options = core_options
        self.options = options
        self.send_limits = SendLimits(flush_timeout=options.flush_timeout)
        self.beta = beta
        self.config = TranscriptionConfig()
        self._event_ids = EventIds()
        self.items = Items(server_vad=True, beta=beta, event_ids=self._event_ids)
        self._decoder: WireDecoder | None = None
        self._limiter = AudioRateLimiter(options.rate_limit, now)
        # the clock of the last input that can make VAD events (audio, a commit, the end): their time for the
        # idle timer, since the core's events carry stream samples only
        self._now = now
        # server VAD's idle timer (idle_timeout_ms): speech in progress stops it; None until the first audio
        self._in_speech = False
        self._quiet_since: float | None = None
        self._quiet_from = 0  # the stream sample where the quiet began
        # 1. Credentials, the origin and the admission slot were the runner's (streamer.server.routes). 2. Say what the
        #    session is.
        created = "transcription_session.created" if self.beta else "session.created"
        self._send({"type": created, "event_id": self._event_ids(), **self._session()})

    # -- inputs (the flush is TranscribingAdapter's) ------------------------------------------------------------------

    def receive_text(self, frame: str, now: float) -> None:
        self._receive(frame, now)

    def receive_bytes(self, frame: bytes, now: float) -> None:
        self._receive(frame, now)  # an invalid_json error: events are text

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        # nobody to send the last transcripts to: the session is over
        self.phase = Phase.CLOSED
        self._close_with(LOST.code, LOST.reason)

    def receive_timer(self, now: float) -> None:
        deadline = self._timeout_deadline()
        if deadline is not None and now >= deadline and self.transcriber is not None:
            # the quiet is committed as an empty item, and the timer starts again
            point = self.transcriber.track(_TRACK).core.samples_received
            self._send_all(self.items.timeout(self._quiet_from, point))
            self._quiet_since, self._quiet_from = now, point
        super().receive_timer(now)

    def next_deadline(self) -> float | None:
        deadlines = [d for d in (super().next_deadline(), self._timeout_deadline()) if d is not None]
        return min(deadlines, default=None)

    def _timeout_deadline(self) -> float | None:
        idle_ms = self.config.idle_timeout_ms
        if self.phase is not Phase.RECEIVING or idle_ms is None or self._in_speech or self._quiet_since is None:
            return None
        return self._quiet_since + idle_ms / 1000

    # -- the story --------------------------------------------------------------------------------------------------

    def _receive(self, frame: str | bytes, now: float) -> None:
        """3. Events until the client goes away, idles out, or the server stops."""
        if not self._note_frame(now):
            return
        self._now = now
        try:
            self._handle(parse_client_event(frame, self.config), now)
        except InvalidRequest as error:
            self._send(error_event(self._event_ids(), error))

    def _idle_error(self) -> IdleTimeout:
        return IdleTimeout(f"no client event for {self.limits.idle_timeout:g} s")

    def _end(self, error: ProtocolError | None, now: float) -> None:
        self._now = now
        super()._end(error, now)

    def _finish(self) -> None:
        """4. Going away on the server's side: what the core could finish, then why."""
        reason = self._error
        assert reason is not None  # the server ends a session only for a reason; a client that leaves ends it at once
        if self.transcriber is not None:
            self._send_all(self.items.end())
        error = InvalidRequest(reason.message, code=reason.code)
        self._send(error_event(self._event_ids(), error, "server_error"))
        self.phase = Phase.CLOSED
        self._close_with(reason.close_code, reason.code)

    def _handle(self, event: SessionUpdate | AudioAppend | AudioCommit | AudioClear, now: float) -> None:
        if isinstance(event, SessionUpdate):
            self._update(event)
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
            transcriber = self._transcriber(now)
            assert self._decoder is not None
            transcriber.feed(_TRACK, self._decoder.decode(event.audio)[0], now)
        elif isinstance(event, AudioCommit | AudioClear):
            transcriber = self._transcriber(now)
            track = transcriber.track(_TRACK)
            point = track.core.samples_received
            if isinstance(event, AudioCommit):
                # committed goes out before finalizing, whose events may complete the item at once (its finals were
                # in before the commit): OpenAI's order is committed, deltas, completed. commit() raises before
                # finalizing when the buffer is too small.
                self._send_all(self.items.commit(point))
                transcriber.finalize(_TRACK, now)
            else:
                transcriber.finalize(_TRACK, now)
                self._send_all(self.items.clear(point))
            self._settle()

    def _update(self, event: SessionUpdate) -> None:
        config = event.config
        if self.transcriber is not None and config.decode_fields() != self.config.decode_fields():
            raise InvalidRequest(
                "the audio format, transcription and turn detection cannot change once audio was appended",
                param="session",
            )
        # a language the model cannot serve is refused here, with the reason, before any audio is accepted for it:
        # the engine would fail every window of it and the items would complete empty (issue 14)
        decode = self.core_options.decode
        base = "session.input_audio_transcription" if event.beta else "session.audio.input.transcription"
        for param, language in [("language", config.language), *(("languages", v) for v in config.languages)]:
            try:
                check_supported(self.scheduler.engine.info, language or decode.language, decode.task)
            except UnsupportedAudio as refusal:
                raise InvalidRequest(refusal.message, code="invalid_value", param=f"{base}.{param}") from None
        self.config = config
        self.items.logprobs = config.logprobs
        updated = "transcription_session.updated" if event.beta else "session.updated"
        self._send({"type": updated, "event_id": self._event_ids(), **self._session(event.beta)})

    def _transcriber(self, now: float) -> Transcriber:
        if self.transcriber is None:
            config = self.config
            decode = replace(
                self.core_options.decode,
                language=config.stream_language or self.core_options.decode.language,
                initial_prompt=config.prompt,
                keywords=config.keywords,
            )
            core_options = replace(self.core_options, decode=decode, endpoint_ms=config.endpoint_ms)
            if config.delay is not None:
                margin = round(core_options.alignatt_margin_ms * DELAY_MARGIN_FACTOR[config.delay])
                core_options = replace(
                    core_options, agreement_n=DELAY_AGREEMENT[config.delay], alignatt_margin_ms=min(5000, margin)
                )
            fmt = AudioFormat(encoding=config.format.encoding, sample_rate=config.format.sample_rate, channels=1)
            self._decoder = WireDecoder(fmt)
            self.items = Items(config.server_vad, self.beta, self._event_ids, config.logprobs)
            self._quiet_since = now if config.server_vad else None
            self.transcriber = Transcriber(
                self.scheduler,
                core_options,
                self.id,
                (_TRACK,),
                fmt.sample_rate,
                self._on_event,
                self._after_events,
            )
            self._log.info(
                "realtime=%s event=audio format=%s server_vad=%s", self.id, config.format.value, config.server_vad
            )
        return self.transcriber

    # -- transcripts ------------------------------------------------------------------------------------------------

    def _on_event(self, track: str, event: Event) -> None:
        if isinstance(event, SpeechStarted):
            self._in_speech = True
            self._send_all(self.items.speech_started(event.start))
        elif isinstance(event, SpeechEnded):
            # VAD events come only from inputs that carry the clock (audio, a commit, the end): self._now is theirs
            self._in_speech = False
            if self._quiet_since is not None:
                self._quiet_since, self._quiet_from = self._now, event.end
            self._send_all(self.items.speech_ended(event.start, event.end, event.reason is EndReason.FINALIZE))
        elif isinstance(event, Final):
            self._send_all(self.items.final(event.start, event.end, event.text, event.words))
        elif isinstance(event, Lost):
            self._send_all(self.items.lost(event.start, event.end, event.reason))

    def _settle(self) -> None:
        if self.transcriber is not None:
            self._send_all(self.items.settle(self.transcriber.track(_TRACK).core.uncommitted_from))

    def _after_events(self) -> None:
        """After every batch of core events (decode results included): complete items, and end once drained."""
        self._settle()
        super()._after_events()
        self.wakeup()

    # -- sending ----------------------------------------------------------------------------------------------------

    def _session(self, beta: bool | None = None) -> dict[str, Any]:
        return {"session": self.config.session_object(self.id, self.beta if beta is None else beta)}

    def _send_all(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self._send(event)

    def _send(self, event: dict[str, Any]) -> None:
        if self.phase is Phase.CLOSED:
            return
        try:
            self._queue(json.dumps(event))
        except SlowReader as error:
            # the events a slow client has not read are kept; this one and the rest are dropped, and the session ends
            self._end(error, self._last_frame)
