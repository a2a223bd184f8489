"""One Deepgram-compatible live stream (:data:`~streamer.integrations.deepgram.DEEPGRAM_PATH`): the endpoint's
sans-I/O adapter (:mod:`streamer.server.adapter`) between Deepgram's frames and a
:class:`~streamer.integrations.transcriber.Transcriber`.

The story (:class:`~streamer.integrations.transcriber.TranscribingAdapter`'s): the handshake's query was parsed and
checked by :func:`handshake_refusal` (HTTP 400 as Deepgram answers a bad request) and credentials, origin and the
admission slot were the runner's (:mod:`streamer.server.routes`, the same row policy as ``/v1/listen``). Binary frames
are raw audio, decoded, mixed down (or, with ``multichannel=true``, one core per channel) and fed to the cores; without
``encoding`` (or with ``opus``/``ogg-opus``) they are the bytes of a WebM, Ogg or WAV file, decoded as they arrive
by :class:`~streamer.server.container_input.ContainerInput` (as on ``/v1/listen?encoding=container``), and the cores
open once the container's header gives its rate and channels. Text frames are ``KeepAlive``, ``Finalize``,
``CloseStream`` and ``Configure``. ``CloseStream`` (or an empty binary frame,
Deepgram's older way to say it) ends the stream: the last Results, ``Metadata``, then close 1000. The idle timeout
(no audio or ``KeepAlive`` for ``--idle-timeout`` seconds, Deepgram's 10 s by default), the session length, the audio
rate limit, a frame too large, a container that cannot be decoded or was cut short (``bad_container``,
``unsupported_audio``: Deepgram's close 1008 ``DATA-0000``, after the audio before the fault), a slow reader and
shutdown end it too, after the Results the flush allows, with ``Metadata``, an ``Error`` saying why, and the close of
:func:`~streamer.integrations.deepgram.close_for`.

How core events become Deepgram's messages:

- ``Partial`` -> interim ``Results`` (``is_final: false``) with ``interim_results=true``; a newer one replaces one the
  client has not read yet.
- ``Final`` -> ``Results`` with ``is_final: true``. The utterance's last final (the one reaching the end point the
  core's ``SpeechEnded`` named) carries ``speech_final: true`` when the end point closed it (``EndReason.VAD``) and
  ``from_finalize: true`` when ``Finalize`` did. An utterance whose words were all final before it closed gets an
  empty final with its flags, as does a ``Finalize`` with nothing to close, so that a client waiting for either
  flag always gets it.
- ``SpeechStarted`` -> ``SpeechStarted`` with ``vad_events=true``.
- ``UtteranceEnd`` (with ``utterance_end_ms``) once the last word's utterance is final and no word follows it within
  ``utterance_end_ms`` of audio: the next speech starts later than that, or that much has been received with no
  speech, or the stream ended.
- ``Lost`` (the engine failed a window) -> an ``Error`` naming the range; the stream goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http import HTTPStatus
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from websockets.http11 import Request, Response

from streamer.core.container import Samples
from streamer.core.errors import (
    DiarizationUnavailable,
    FrameTooLarge,
    IdleTimeout,
    MalformedMessage,
    ProtocolError,
    SessionTooLong,
    SlowReader,
)
from streamer.core.events import EndReason, Event, Final, Lost, Partial, SpeechEnded, SpeechStarted, Word
from streamer.core.options import CoreOptions
from streamer.core.speakers import SpeakerOptions
from streamer.core.stream import StreamCore
from streamer.core.units import SAMPLE_RATE
from streamer.engine.types import EngineInfo, check_supported
from streamer.integrations.deepgram import (
    MAX_ENDPOINTING_MS,
    ClientMessage,
    ConfigureFailure,
    DeepgramErrorMessage,
    DeepgramParams,
    DeepgramSpeechStartedMessage,
    Metadata,
    QueryWarning,
    Results,
    UtteranceEnd,
    WordResult,
    close_for,
    model_info,
    parse_client_message,
    parse_query,
)
from streamer.integrations.transcriber import Transcriber, TranscribingAdapter
from streamer.server.adapter import LOST, SendLimits, session_log
from streamer.server.audio_input import check_frame_size, open_audio_input
from streamer.server.endpoint import Opening, Refusal, WebSocketEndpoint
from streamer.server.lifecycle import Phase, StreamLimits
from streamer.server.outbox import Outbox
from streamer.server.ratelimit import AudioRateLimiter
from streamer.server.scheduler import Scheduler
from streamer.server.session_options import SessionOptions
from streamer.server.speaker_worker import DIARIZATION_UNAVAILABLE, SpeakerWorker
from streamer.server.static import http_response

if TYPE_CHECKING:
    from streamer.server.adapter import Adapter
    from streamer.server.serve import Server

__all__ = ["DeepgramEndpoint", "DeepgramSession", "core_options_for", "handshake_refusal", "open_deepgram_session"]

logger = logging.getLogger(__name__)

_MS = SAMPLE_RATE // 1000
# a SchemaError quotes the start of the frame it could not read, no more (the frame is the client's)
_QUOTED_CHARS = 200


def core_options_for(params: DeepgramParams, core: CoreOptions) -> CoreOptions:
    """The server's core options with what the query changes: the language, keywords and the end-point silence."""
    decode = replace(core.decode, language=params.language or core.decode.language, keywords=params.keywords)
    endpoint_ms = core.endpoint_ms if params.endpointing_ms is None else params.endpointing_ms
    if params.endpointing_off:
        endpoint_ms = MAX_ENDPOINTING_MS
    return replace(core, decode=decode, endpoint_ms=endpoint_ms)


def handshake_refusal(
    path: str, info: EngineInfo, core: CoreOptions, speakers: SpeakerWorker | None = None
) -> Response | None:
    """Why the handshake to ``path`` cannot be served, as Deepgram answers it: HTTP 400 with the reason in the
    ``dg-error`` header and a JSON body; None when it can. The server calls it before the WebSocket handshake, once
    the model is loaded."""
    try:
        params = parse_query(path)
        check_supported(info, params.language or core.decode.language, core.decode.task)
        check_speakers(params, speakers)
    except ProtocolError as refusal:
        request_id = str(uuid.uuid4())
        logger.info("event=rejected route=deepgram code=%s reason=%r", refusal.code, refusal.message)
        body = {"err_code": refusal.code, "err_msg": refusal.message, "request_id": request_id}
        # a header value holds printable ASCII only; the message may quote the client's values
        header = refusal.message.encode("ascii", "backslashreplace").decode("ascii").replace("\n", " ")[:300]
        headers = {"dg-error": header, "dg-request-id": request_id}
        return http_response(HTTPStatus.BAD_REQUEST, json.dumps(body).encode(), "application/json", headers)
    return None


def check_speakers(params: DeepgramParams, speakers: SpeakerWorker | None) -> None:
    """:class:`~streamer.core.errors.DiarizationUnavailable` when ``diarize=true`` asks for speaker labels this
    server cannot give."""
    if params.diarize and (speakers is None or not speakers.available):
        raise DiarizationUnavailable(DIARIZATION_UNAVAILABLE)


def open_deepgram_session(
    path: str,
    scheduler: Scheduler,
    core_options: CoreOptions,
    options: SessionOptions,
    model: str,
    created: str,
    now: float,
    speakers: SpeakerWorker | None = None,
) -> DeepgramSession:
    """The adapter of a connection to ``path`` (with its query), opened at ``now`` (``created``: the same moment as ISO
    8601 UTC, for Metadata). Raises the :class:`~streamer.core.errors.ProtocolError` of a query
    :func:`handshake_refusal` would have refused (the runner then refuses the connection)."""
    params = parse_query(path)
    check_supported(scheduler.engine.info, params.language or core_options.decode.language, core_options.decode.task)
    check_speakers(params, speakers)
    return DeepgramSession(params, scheduler, core_options, options, model, created, now, speakers)


class DeepgramEndpoint(WebSocketEndpoint):
    """``/deepgram/v1/listen``: Deepgram's live API, refused as Deepgram refuses (HTTP 400 with ``dg-error`` before
    the handshake; after it, Deepgram's error frame and close codes)."""

    def handshake_refusal(self, server: Server, request: Request) -> Response | None:
        return handshake_refusal(
            request.path, server.ready_scheduler().engine.info, server.config.core, server.speakers
        )

    async def open(self, server: Server, opening: Opening) -> Adapter:
        c = server.config
        created = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        adapter = open_deepgram_session(
            opening.request.path,
            server.ready_scheduler(),
            c.core,
            c.session,
            c.model,
            created,
            opening.now,
            server.speakers,
        )
        adapter.owner = opening.principal
        return adapter

    def refusal(self, error: ProtocolError) -> Refusal:
        close_code, reason = close_for(error)
        return Refusal(DeepgramErrorMessage(error.code, error.message).to_json(), close_code, reason)


@dataclass
class _Closing:
    """An utterance the core closed (its ``SpeechEnded``) whose last final has not gone out: the flags it carries."""

    start: int
    end: int
    speech_final: bool
    from_finalize: bool


@dataclass
class _DeepgramTranscript:
    """One transcript of the stream (a channel, or the mixed-down channels) and where its utterances stand."""

    index: int
    name: str
    closings: deque[_Closing] = field(default_factory=deque)
    # the VAD's speech span is open (SpeechStarted, no SpeechEnded yet)
    open: bool = False
    # end of the last word of the finals sent since the last UtteranceEnd (None: no word since)
    last_word_end: int | None = None
    # start of the first speech after that word (None: none yet)
    next_speech: int | None = None


def _interim_channel(out: _Out) -> int | None:
    return out.interim_of


@dataclass(frozen=True)
class _Out:
    frame: str
    # the channel of an interim Results (a newer one replaces it while unsent); None for every other message
    interim_of: int | None = None


class DeepgramSession(TranscribingAdapter):
    """One connection, sans-I/O, opened at ``now``; see the module docstring. Build with
    :func:`open_deepgram_session`."""

    kind = "deepgram"

    def __init__(
        self,
        params: DeepgramParams,
        scheduler: Scheduler,
        core_options: CoreOptions,
        options: SessionOptions,
        model: str,
        created: str,
        now: float,
        speakers: SpeakerWorker | None = None,
    ) -> None:
        super().__init__(StreamLimits(options.idle_timeout, options.flush_timeout, options.max_session_seconds), now)
        # Deepgram's request ids are UUIDs; the SDK reads them from every Results and from Metadata
        self.id = str(uuid.uuid4())
        self._log = session_log(logger, self.id)
        self.params = params
        self.options = options
        self.send_limits = SendLimits(
            send_timeout=options.slow_reader_seconds,
            flush_timeout=options.flush_timeout,
            socket_send_buffer=options.socket_send_buffer,
        )
        self.model = model_info(model)
        self.created = created
        warnings = list(params.warnings)
        if params.model is not None and params.model != model:
            warnings.append(QueryWarning("model", "adjusted", f"{params.model} is served by {model}"))
        self.warnings = tuple(warnings)
        self._scheduler = scheduler
        self._speakers = speakers
        self._core_options = core_options_for(params, core_options)
        self._limiter = AudioRateLimiter(options.rate_limit, now)
        self._sha256 = hashlib.sha256()
        self._outbox: Outbox[_Out] = Outbox(options.send_buffer, _interim_channel)
        # the transcripts: known now, but for a container with multichannel (one per channel of the container)
        self.channels: list[_DeepgramTranscript] = []
        self._by_name: dict[str, _DeepgramTranscript] = {}
        if params.transcripts is not None:
            self._add_channels(params.transcripts)
        # 2. One core per transcript, registered with the scheduler: now for raw audio; for a container, once its
        # header gives the rate (and the channels), when its first samples come (_receive_samples)
        raw_format = None if params.container is not None else params.audio_format
        self._input = open_audio_input(
            raw_format,
            params.container,
            params.transcripts,
            options.rate_limit,
            self._limiter,
            self._receive_samples,
        )
        if params.container is None:
            self._open_transcriber(params.sample_rate)
        self._log.info(
            "deepgram=%s event=open encoding=%s sample_rate=%d channels=%d multichannel=%s ignored=%d",
            self.id,
            params.encoding.value,
            params.sample_rate,
            params.channels,
            params.multichannel,
            len(self.warnings),
        )

    # -- inputs (idle timeout, shutdown and the flush are TranscribingAdapter's) ------------------------------------

    def receive_bytes(self, frame: bytes, now: float) -> None:
        """3. Audio, until the stream ends."""
        if not self._note_frame(now):
            return
        if not frame:
            self._end(None, now)  # an empty binary frame is Deepgram's older CloseStream
            return
        try:
            self._receive_audio(frame, now)
        except ProtocolError as error:
            self._end(error, now)

    def receive_text(self, frame: str, now: float) -> None:
        if not self._note_frame(now):
            return
        try:
            message = parse_client_message(frame)
        except MalformedMessage as error:
            # Deepgram's SchemaError: the frame is quoted back and the stream goes on (no audio is at stake)
            self._send(DeepgramErrorMessage("SchemaError", error.message, frame[:_QUOTED_CHARS]).to_json())
            return
        except FrameTooLarge as error:
            self._end(error, now)
            return
        if message is ClientMessage.CLOSE_STREAM:
            self._end(None, now)
        elif message is ClientMessage.FINALIZE:
            self._finalize(now)
        elif message is ClientMessage.CONFIGURE:
            self._send(ConfigureFailure(self.id).to_json())
        # KeepAlive: noting the frame's time (above) is all it asks

    def receive_connection_lost(self, now: float, dropped: bool = True) -> None:
        # nobody to send the last Results to: the stream is over (Deepgram streams cannot be resumed)
        self.phase = Phase.CLOSED
        self._close_with(LOST.code, LOST.reason)

    def receive_send_timeout(self, now: float) -> None:
        self._slow_reader(f"the client did not read for {self.options.slow_reader_seconds:g} s")

    # -- outputs ----------------------------------------------------------------------------------------------------

    def messages_to_send(self, now: float, limit: int | None = None) -> list[str]:
        return [out.frame for out in self._outbox.take(limit)]

    # -- the story --------------------------------------------------------------------------------------------------

    def _add_channels(self, count: int) -> None:
        self.channels = [_DeepgramTranscript(index, str(index)) for index in range(count)]
        self._by_name = {channel.name: channel for channel in self.channels}

    def _open_transcriber(self, sample_rate: int) -> Transcriber:
        self.transcriber = Transcriber(
            self._scheduler,
            self._core_options,
            self.id,
            tuple(self._by_name),
            sample_rate,
            self._on_event,
            self._after_events,
            self._speakers,
            SpeakerOptions() if self.params.diarize else None,
        )
        return self.transcriber

    def _receive_audio(self, frame: bytes, now: float) -> None:
        check_frame_size(frame, self.options.max_frame_bytes)
        self._sha256.update(frame)
        self._input.receive(frame, now)

    def _receive_samples(self, samples: Samples, now: float) -> None:
        """Decoded audio, one row per transcript (mixed down for one). A container's first opens the cores at its
        rate, one per channel with multichannel; a stream keeps its first file's rate and channels (the decoder
        refuses a file that changes them)."""
        if self.transcriber is None:
            if not self.channels:
                self._add_channels(samples.channels)
            self._open_transcriber(samples.sample_rate)
        self._feed(samples.audio, now)

    def _feed(self, per_transcript: npt.NDArray[np.float32], now: float) -> None:
        assert self.transcriber is not None
        for channel, samples in zip(self.channels, per_transcript, strict=True):
            self.transcriber.feed(channel.name, samples, now)

    def _end(self, error: ProtocolError | None, now: float) -> None:
        """The stream ends (TranscribingAdapter's story), a container's last samples first: then a file cut short
        is bad_container (unless another error ended the stream)."""
        if self.phase is Phase.RECEIVING:
            cut_short = self._input.end(now)
            if cut_short is not None:
                self._log.info(
                    "deepgram=%s event=container_error code=%s reason=%r", self.id, cut_short.code, cut_short.message
                )
                error = error or cut_short
        super()._end(error, now)

    def _core(self, channel: _DeepgramTranscript) -> StreamCore:
        assert self.transcriber is not None  # every caller follows an event of it
        return self.transcriber.track(channel.name).core

    def _finalize(self, now: float) -> None:
        """``Finalize``: close every open utterance now; its last final carries ``from_finalize``."""
        for channel in self.channels:
            if self.transcriber is None:  # a container whose header is not in yet: nothing heard
                self._send_empty_final(channel, _Closing(0, 0, speech_final=False, from_finalize=True))
                continue
            was_open = channel.open
            self.transcriber.finalize(channel.name, now)  # an open utterance closes: SpeechEnded(FINALIZE)
            if was_open:
                continue
            if channel.closings:
                channel.closings[-1].from_finalize = True  # closed by its end point, its final still to come
            else:
                at = self._core(channel).samples_received
                self._send_empty_final(channel, _Closing(at, at, speech_final=False, from_finalize=True))

    def _idle_error(self) -> IdleTimeout:
        return IdleTimeout(f"no audio or KeepAlive for {self.limits.idle_timeout:g} s")

    def _too_long_error(self) -> SessionTooLong:
        return SessionTooLong(f"streams may last at most {self.limits.max_session_seconds:g} s")

    def _finish(self) -> None:
        """4. The last events are in (or the flush ran out): the last UtteranceEnds, Metadata, why, the close."""
        for channel in self.channels:
            if self.params.utterance_end_ms is not None and channel.last_word_end is not None:
                self._utterance_end(channel)
        self._send(self._metadata().to_json())
        error = self._error
        if error is not None:
            self._send(DeepgramErrorMessage(error.code, error.message).to_json())
        self.phase = Phase.CLOSED
        code, reason = close_for(error)
        self._close_with(code, reason)
        self._log.info("deepgram=%s event=closed code=%d received_s=%.2f", self.id, code, self._seconds_received)

    def _slow_reader(self, why: str) -> None:
        """The client does not read: what is queued cannot reach it in time; say why and close."""
        if self.phase is Phase.CLOSED:
            return
        self._log.warning("deepgram=%s event=slow_reader unsent=%d", self.id, len(self._outbox))
        error = SlowReader(why)
        self._outbox.clear()
        self._outbox.put(_Out(DeepgramErrorMessage(error.code, error.message).to_json()))
        self.phase = Phase.CLOSED
        self._close_with(*close_for(error))

    # -- transcripts ------------------------------------------------------------------------------------------------

    def _on_event(self, track: str, event: Event) -> None:
        channel = self._by_name[track]
        if isinstance(event, SpeechStarted):
            channel.open = True
            if channel.last_word_end is not None and channel.next_speech is None:
                channel.next_speech = event.start
            if self.params.vad_events:
                self._send(DeepgramSpeechStartedMessage(self._index(channel), _seconds(event.start)).to_json())
        elif isinstance(event, SpeechEnded):
            channel.open = False
            speech_final = event.reason is EndReason.VAD and not self.params.endpointing_off
            from_finalize = event.reason is EndReason.FINALIZE
            channel.closings.append(_Closing(event.start, event.end, speech_final, from_finalize))
        elif isinstance(event, Partial):
            if self.params.interim_results:
                results = self._results(channel, event.start, event.end, event.words, is_final=False)
                self._send(results.to_json(), interim_of=channel.index)
        elif isinstance(event, Final):
            closing = channel.closings.popleft() if self._closes(channel, event.end) else None
            gap = self._utterance_gap()
            last = channel.last_word_end
            # the words before this final's ended long enough before its first: their utterance ended
            if event.words and last is not None and gap is not None and event.words[0].start - last >= gap:
                self._utterance_end(channel)
            self._send(self._results(channel, event.start, event.end, event.words, True, closing).to_json())
            if event.words:
                channel.last_word_end = event.words[-1].end
                if channel.next_speech is not None and channel.next_speech < channel.last_word_end:
                    channel.next_speech = None
        elif isinstance(event, Lost):
            lost = DeepgramErrorMessage(
                "engine_failure",
                f"{event.reason}: {_seconds(event.start)}-{_seconds(event.end)} s of channel {channel.index} "
                "is not transcribed",
            )
            self._send(lost.to_json())
            if self._closes(channel, event.end):
                self._send_empty_final(channel, channel.closings.popleft())
        self._check_utterance_end(channel)

    def _after_events(self) -> None:
        """After every batch of core events: settle utterances that closed with every word final already, then the
        utterance ends that are due, then (TranscribingAdapter) end once drained."""
        for channel in self.channels:
            pending_from = self._core(channel).uncommitted_from
            while channel.closings and (pending_from is None or pending_from > channel.closings[0].start):
                self._send_empty_final(channel, channel.closings.popleft())
            self._check_utterance_end(channel)
        super()._after_events()
        self.wakeup()

    @staticmethod
    def _closes(channel: _DeepgramTranscript, end: int) -> bool:
        """Whether a final or lost span ending at ``end`` is the last of the oldest closed utterance."""
        return bool(channel.closings) and end >= channel.closings[0].end

    def _utterance_gap(self) -> int | None:
        ms = self.params.utterance_end_ms
        return None if ms is None else ms * _MS

    def _check_utterance_end(self, channel: _DeepgramTranscript) -> None:
        """Send UtteranceEnd once the last word's utterance is final and ``utterance_end_ms`` pass without a word."""
        gap = self._utterance_gap()
        if gap is None or channel.last_word_end is None or channel.closings:
            return
        last, following = channel.last_word_end, channel.next_speech
        # the next speech starts that much later, or that much audio came with no speech (yet) after the word
        received = self._core(channel).samples_received
        if (following is not None and following - last >= gap) or (not channel.open and received - last >= gap):
            self._utterance_end(channel)

    def _utterance_end(self, channel: _DeepgramTranscript) -> None:
        assert channel.last_word_end is not None
        self._send(UtteranceEnd(self._index(channel), _seconds(channel.last_word_end)).to_json())
        channel.last_word_end = None
        channel.next_speech = None

    def _send_empty_final(self, channel: _DeepgramTranscript, closing: _Closing) -> None:
        self._send(self._results(channel, closing.end, closing.end, (), True, closing).to_json())

    def _results(
        self,
        channel: _DeepgramTranscript,
        start: int,
        end: int,
        words: tuple[Word, ...],
        is_final: bool,
        closing: _Closing | None = None,
    ) -> Results:
        return Results(
            request_id=self.id,
            model=self.model,
            channel_index=self._index(channel),
            start=_seconds(start),
            duration=_seconds(max(0, end - start)),
            words=tuple(
                WordResult(
                    w.text,
                    _seconds(w.start),
                    _seconds(w.end),
                    round(w.probability, 4),
                    w.speaker,
                    w.speaker_confidence,
                )
                for w in words
            ),
            is_final=is_final,
            speech_final=closing is not None and closing.speech_final,
            from_finalize=closing is not None and closing.from_finalize,
            punctuate=self.params.punctuate,
        )

    def _index(self, channel: _DeepgramTranscript) -> tuple[int, int]:
        return (channel.index, len(self.channels))

    @property
    def _seconds_received(self) -> float:
        return self._input.seconds

    def _metadata(self) -> Metadata:
        return Metadata(
            request_id=self.id,
            model=self.model,
            created=self.created,
            sha256=self._sha256.hexdigest(),
            duration=round(self._seconds_received, 6),
            # a container's, once its header is in (none yet: 0, as Deepgram says of a stream without audio)
            channels=self._input.channels or 0,
            warnings=self.warnings,
        )

    # -- sending ----------------------------------------------------------------------------------------------------

    def _send(self, frame: str, interim_of: int | None = None) -> None:
        if self.phase is Phase.CLOSED:
            return
        try:
            self._outbox.put(_Out(frame, interim_of))  # a newer interim Results replaces its channel's
        except SlowReader:
            self._slow_reader(f"the client did not read {self.options.send_buffer} messages in time")


def _seconds(samples: int) -> float:
    return round(samples / SAMPLE_RATE, 4)
