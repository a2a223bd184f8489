"""The sans-I/O streaming core: audio in, decode requests out, decode results in, transcript events out.

It never awaits, never reads the clock (nothing in it depends on time: the session's timers call
:meth:`StreamCore.receive_finalize` when a deadline passes) and never calls the model. The session feeds it::

    core.receive_audio(samples)                 # VAD + windowing (receive_configure: new prompt and keywords)
    for request in core.windows_to_decode():    # at most one outstanding per stream
        ...                                     # the scheduler runs it, later:
    core.receive_decode_result(result)          # or receive_decode_failure(request_id, reason)
    events = core.events_received()             # SpeechStarted | SpeechEnded | Partial | Final | NonSpeech | Lost

Accounting: the spans of Final, NonSpeech and Lost events tile ``[origin, samples_received)`` in stream order once the
stream has ended (see :mod:`streamer.core.events`). Stream order holds throughout: a NonSpeech span is held back until
the speech before it is committed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np
import numpy.typing as npt

from streamer.core.agreement import (
    Agreement,
    AlignAtt,
    AutoCommit,
    CommitPolicy,
    GuardOptions,
    LocalAgreement,
    Policy,
    Verdict,
    check_result,
    is_spoken,
    strip_committed_overlap,
)
from streamer.core.agreement import truncate_loops as _truncate_loops
from streamer.core.errors import ConfigError, InvalidState
from streamer.core.events import EndReason, Event, Final, Lost, NonSpeech, Partial, SpeechEnded, SpeechStarted, Word
from streamer.core.requests import DecodeOptions, DecodeRequest, DecodeResult, StreamId
from streamer.core.units import N_SAMPLES, SAMPLE_RATE
from streamer.core.vad import (
    ClassifierFactory,
    SpeechEnd,
    VadBackend,
    VadOptions,
    VadSpan,
    VoiceActivityDetector,
    make_classifier,
)
from streamer.core.windowing import AudioBuffer, Window, WindowPolicy, next_window

__all__ = ["STREAM_ENCODER_PAD_SECONDS", "CoreOptions", "CoreState", "StreamCore", "StreamOrigin", "for_the_model"]

# the silence a streamed window's encoder reads after its audio (DecodeOptions.encoder_pad_seconds). `streamer bench
# accuracy` over the evaluation set (docs/benchmarks.md): 9.74 % streamed against 9.59 % offline, the first partial
# p50 in 0.19 s (0.51 s with the whole 30 s, which streamed 9.40 %); 6 s streamed 10.81 %
STREAM_ENCODER_PAD_SECONDS = 10.0

_MS = SAMPLE_RATE // 1000
# an utterance's closing window is decoded again where the decoding stopped early (resume_after_ms) at most this many
# times, each starting at least a short word later than the window before ...
_MAX_RESUMES = 4
_RESUME_PROGRESS = 300 * _MS
# ... and re-reading at most this many committed words (strip_committed_overlap compares five)
_REREAD = 4
_ENDS = (".", "?", "!")  # a word ending so ends a sentence


@dataclass(frozen=True)
class CoreOptions:
    """How one stream is turned into transcript events. Validated in :meth:`validate`."""

    # voice activity detection; its min_silence_ms is replaced by endpoint_ms
    vad: VadOptions = field(default_factory=VadOptions)
    # a new window is decoded after this much new speech (0.2 to 5 s): lower is faster partials and commits, more
    # compute (under load the windows of a stream coalesce: one outstanding at a time)
    step_ms: int = 500
    # until the segment being decoded shows words (an utterance's start, after a commit), windows come after this
    # much new speech (None, or more than step_ms: step_ms): its partial is the first text the speaker sees
    first_step_ms: int | None = 300
    # a pause this long ends the utterance: one last decode, then all its text is final
    endpoint_ms: int = 500
    # which words of a hypothesis are committed: LocalAgreement-n (agreement_n hypotheses agree on them), AlignAtt
    # (the decoder's attention has moved alignatt_margin_ms past them), or auto: LocalAgreement, and AlignAtt for a
    # window that waited for a busy engine (see streamer.core.agreement). Auto streamed the evaluation set as
    # accurately as LocalAgreement on one stream and held 6 real-time streams where LocalAgreement held 4
    # (docs/benchmarks.md, accuracy and capacity)
    policy: Policy = Policy.AUTO
    # a word is committed once this many successive hypotheses agree on it (LocalAgreement-n) ...
    agreement_n: int = 2
    # ... and it ends at least this long before the decoded audio does (0: wherever it ends): two windows a short
    # step apart agree easily on a guess at the edge
    agreement_margin_ms: int = 700
    # AlignAtt: a word is committed once its alignment ends this long before the end of the decoded audio
    alignatt_margin_ms: int = 500
    # auto: a window that ends more than a step and this much after the stream's previous one (a busy engine kept
    # it waiting) commits by AlignAtt, the others by LocalAgreement
    auto_wait_ms: int = 500
    # words the policy settles while an utterance goes on are shown (in partials) but held back until the
    # utterance's uncommitted speech is longer than this; its end point then commits it all from one decode of the
    # whole utterance, with its full context (0: commit as soon as settled)
    commit_hold_ms: int = 0
    # the window that closes an utterance and whose words stop this long before its speech does (the decoder
    # emitted end-of-text early) does not commit the rest of the audio without words: the words before its last one
    # are committed, and the rest is decoded again from there, prompted with them, as Whisper's own transcribe seeks
    # on (0: commit the rest without words). tiny.en stopped after "one day, and" with 3.6 s of an utterance left on
    # LibriSpeech 8463-287645-0007 and lost its last 16 words
    resume_after_ms: int = 2000
    # the longest window sent to the engine (the model's 30 s input)
    max_window_ms: int = N_SAMPLES // _MS
    # an utterance's windows start up to this long before it, at the first word committed there: Whisper hears what
    # led up to it, as offline; the words re-read there are committed already and dropped from its hypotheses (0:
    # windows start at the utterance)
    context_ms: int = 10000
    # at most this many characters of recent committed text are sent as the prompt
    prompt_max_chars: int = 200
    # condition each window on the committed text before it (whisper's condition_on_previous_text)
    condition_on_committed: bool = True
    # non-speech is reported at least this often during long silences
    nonspeech_report_ms: int = 1000
    # windows re-read the utterance from its start (or the last trim point) for context; once a window is longer
    # than this, its start moves to the end of the last committed sentence (or, past twice this, any committed word)
    trim_after_ms: int = 10000
    # how windows are decoded: one temperature (no fallback) keeps streaming latency flat; word timings are needed;
    # a window caught in a loop stops early (the guards below cut loops anyway), so it cannot stall other streams;
    # the encoder reads the window's audio and 10 s of silence, not Whisper's whole 30 s (bench capacity: engine
    # busy 61 % at 2 streams against 89 %; docs/benchmarks.md, encoder span)
    decode: DecodeOptions = field(
        default_factory=lambda: DecodeOptions(
            temperatures=(0.0,),
            word_timestamps=True,
            max_tokens_per_second=12.0,
            stop_on_repeats=3,
            encoder_pad_seconds=STREAM_ENCODER_PAD_SECONDS,
        )
    )
    # when a result is not trusted (no speech, loops)
    guards: GuardOptions = field(default_factory=GuardOptions)

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        self.vad.validate()
        self.decode.validate()
        self.guards.validate()
        if not 200 <= self.step_ms <= 5000:
            raise ConfigError("step_ms must be between 200 and 5000")
        if not self.vad.frame_ms <= self.endpoint_ms <= 10000:
            raise ConfigError("endpoint_ms must be between the VAD frame and 10000")
        if self.first_step_ms is not None and not 200 <= self.first_step_ms <= 5000:
            raise ConfigError("first_step_ms must be between 200 and 5000")
        if not 1 <= self.agreement_n <= 5:
            raise ConfigError("agreement_n must be between 1 and 5")
        if not 0 <= self.alignatt_margin_ms <= 5000:
            raise ConfigError("alignatt_margin_ms must be between 0 and 5000")
        if not 0 <= self.auto_wait_ms <= N_SAMPLES // _MS:
            raise ConfigError(f"auto_wait_ms must be between 0 and {N_SAMPLES // _MS}")
        if not 0 <= self.agreement_margin_ms <= 5000:
            raise ConfigError("agreement_margin_ms must be between 0 and 5000")
        if not 0 <= self.commit_hold_ms <= N_SAMPLES // _MS:
            raise ConfigError(f"commit_hold_ms must be between 0 and {N_SAMPLES // _MS}")
        if self.resume_after_ms and not 1000 <= self.resume_after_ms <= N_SAMPLES // _MS:
            raise ConfigError(f"resume_after_ms must be 0 or between 1000 and {N_SAMPLES // _MS}")
        if not self.step_ms <= self.max_window_ms <= N_SAMPLES // _MS:
            raise ConfigError(f"max_window_ms must be between step_ms and {N_SAMPLES // _MS}")
        if not 0 <= self.context_ms <= 10000:
            raise ConfigError("context_ms must be between 0 and 10000")
        if not 0 <= self.prompt_max_chars <= 1000:
            raise ConfigError("prompt_max_chars must be between 0 and 1000")
        if not self.step_ms <= self.trim_after_ms <= self.max_window_ms:
            raise ConfigError("trim_after_ms must be between step_ms and max_window_ms")
        if self.nonspeech_report_ms < 100:
            raise ConfigError("nonspeech_report_ms must be >= 100")
        if not self.decode.word_timestamps:
            raise ConfigError("streaming needs word_timestamps")


class CoreState(Enum):
    LISTENING = "listening"  # audio is accepted
    ENDING = "ending"  # end of stream received; decodes still to run or events to drain
    ENDED = "ended"  # everything decided; events may remain until drained


@dataclass(frozen=True)
class StreamOrigin:
    """Where a core starts in its stream: at 0 for a new stream; further on when it takes over a stream another
    core (another process: :mod:`streamer.server.resume`) accounted for up to ``start``.

    A core taking over mid-utterance needs the audio the other core's windows would have re-read: ``replay_from``
    (that core's :attr:`StreamCore.context_start`) is where the audio it is fed begins. What lies in
    ``[replay_from, start)`` is context only: it goes through the VAD and into the windows, and nothing in it is
    accounted again (no event ends at or before ``start``, no ``SpeechStarted`` for an utterance begun before it);
    the words decoded there are dropped as the other core would have dropped them. Without it, decoding restarts
    mid-utterance, often mid-word, with no acoustic context, and whole phrases come out wrong (issue 18)."""

    # 16 kHz samples before this position are all accounted for by Final, NonSpeech or Lost events already
    start: int = 0
    # the segment_id of this core's first segment (the other core's next one)
    segment_id: int = 0
    # the last committed words before ``start``: the prompt of the first windows, and what overlap removal compares
    context: tuple[Word, ...] = ()
    # the stream position of the first sample the core is fed: at or before ``start`` and at most one model window
    # (30 s) before it; None: ``start`` (no context)
    replay_from: int | None = None

    @property
    def first_sample(self) -> int:
        """The stream position of the first sample fed to the core."""
        return self.start if self.replay_from is None else self.replay_from

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.start < 0 or self.segment_id < 0:
            raise ConfigError("a stream origin's start and segment_id must be >= 0")
        if not max(0, self.start - N_SAMPLES) <= self.first_sample <= self.start:
            raise ConfigError("replay_from must be at or before start, and at most 30 s (one window) before it")


@dataclass
class _Utterance:
    """One VAD speech span (or the part of it before a forced finalisation), in stream order."""

    start: int
    speech_end: int  # end of its speech received so far
    committed: int  # accounting position: Final/Lost events cover [start, committed)
    decoded: int  # end of the last window sent
    closed: bool = False  # no more audio will join it
    anchor: int = -1  # where its windows start (utterance start, later a trim point at or before ``committed``)
    sentence_end: int = -1  # end of the last committed word that ends a sentence
    agreement: CommitPolicy = field(default_factory=LocalAgreement)
    partial_text: str = ""
    # the language its windows are decoded in, once its first words are committed (None: each window detects it)
    language: str | None = None
    # the language of its latest decoded window (what its uncommitted hypothesis is in)
    heard: str = ""
    # its closed windows resume here, where the last one's decoding stopped early (-1: none did); see resume_after_ms
    resume: int = -1
    resumes: int = 0


@dataclass
class _Gap:
    """Non-speech audio waiting for the speech before it to be committed."""

    start: int
    end: int


@dataclass(frozen=True)
class _Outstanding:
    request_id: int
    window: Window


def _clip(word: Word, start: int, end: int) -> Word:
    lo = min(max(word.start, start), end)
    return Word(word.text, lo, min(max(word.end, lo), end), word.probability)


def for_the_model(options: CoreOptions, multilingual: bool) -> CoreOptions:
    """``options`` as a stream decoded by this model must use them; every runner calls it before making a core
    (the session, the call pipeline, the benchmarks' simulator and ``bench gains``).

    A multilingual model that detects each utterance's language (``decode.language`` None) gets no context from
    the utterances before (``context_ms`` 0): a window that starts in German makes Whisper detect German for the
    French that follows, and write the French as German."""
    if multilingual and options.decode.language is None and options.context_ms:
        return replace(options, context_ms=0)
    return options


class StreamCore:
    """Turns one stream's audio into transcript events; see the module docstring for the call sequence.

    ``vad_classifiers`` makes the voice activity detector's frame classifier when ``options.vad.backend`` runs a model
    (silero): pass :data:`streamer.engine.silero_vad.CLASSIFIERS` (see :func:`streamer.core.vad.make_classifier`).
    """

    def __init__(
        self,
        options: CoreOptions | None = None,
        stream_id: StreamId | None = None,
        origin: StreamOrigin | None = None,
        *,
        vad_classifiers: Mapping[VadBackend, ClassifierFactory] | None = None,
    ) -> None:
        self.options = options = options or CoreOptions()
        options.validate()
        self.stream_id = stream_id
        origin = origin or StreamOrigin()
        origin.validate()
        # another core accounted for everything before this position: none of this core's accounting reaches before it
        self._origin = origin.start
        # where this core's first sample sits in the stream (before _origin when it is fed context to re-read)
        self._first = origin.first_sample
        vad = replace(options.vad, min_silence_ms=options.endpoint_ms)
        self._vad = VoiceActivityDetector(vad, make_classifier(vad, vad_classifiers))
        self._policy = WindowPolicy(step=options.step_ms * _MS, max_window=options.max_window_ms * _MS)
        # while the segment being decoded has shown no words
        self._first_policy = replace(
            self._policy, step=min(options.first_step_ms or options.step_ms, options.step_ms) * _MS
        )
        self._buffer = AudioBuffer(self._first)
        self._queue: deque[_Utterance | _Gap] = deque()  # stream order; the head is the next to account
        self._open: _Utterance | None = None  # the utterance speech is joining
        self._outstanding: _Outstanding | None = None
        self._next_request_id = 1
        self._segment_id = origin.segment_id
        # recent committed words, for the prompt and overlap removal
        self._committed_words: list[Word] = list(origin.context[-64:])
        self._events: list[Event] = []
        self._state = CoreState.LISTENING
        self._received = self._first

    # --- properties ------------------------------------------------------------------------------------------------

    @property
    def state(self) -> CoreState:
        return self._state

    @property
    def samples_received(self) -> int:
        return self._received

    @property
    def next_segment_id(self) -> int:
        """The ``segment_id`` of the next Final or Partial: a core taking the stream over starts from it."""
        return self._segment_id

    @property
    def final_due(self) -> bool:
        """Whether :meth:`windows_to_decode` would now offer the window that closes an utterance (its final)."""
        if self._outstanding is not None or not self._queue:
            return False
        head = self._queue[0]
        return isinstance(head, _Utterance) and head.closed and head.speech_end > head.committed

    @property
    def buffer_start(self) -> int:
        """The oldest stream sample still buffered: every window decoded from now on ends after it."""
        return self._buffer.start

    @property
    def context_start(self) -> int:
        """Where a core taking this stream over at its accounted position must start re-reading audio to decode it
        as this one would (:attr:`StreamOrigin.replay_from`): the anchor of the utterance being committed (its
        start, or a trim point at or before its committed position); with none, the accounted position itself (or,
        before the VAD has decided anything, the first sample fed). A commit moves it: keep it with the accounting
        (:class:`streamer.server.resume.ChannelRecord`).

        Where the other core will find an utterance's start afresh, it falls on this core's VAD frame grid, so that
        core analyses the same frames: an utterance starts ``pad_before_ms`` before its first voiced frame, which
        need not be a whole number of frames, and a core fed from that very sample would find the onset on another
        grid, up to a frame later. Mid-utterance (a trim point) it is the exact sample the windows start at."""
        for item in self._queue:
            if isinstance(item, _Utterance):
                start = min(item.anchor, item.committed)
                return self._on_frame_grid(start) if start <= item.start else start
            return self._on_frame_grid(self._anchor(item.start))  # where the next utterance's windows may start
        return self._on_frame_grid(self._anchor(self._first + self._vad.decided))

    def _on_frame_grid(self, position: int) -> int:
        frame = self._vad.frame_samples
        return self._first + (position - self._first) // frame * frame

    @property
    def done(self) -> bool:
        """Ended and every event drained: the session may close."""
        return self._state is CoreState.ENDED and not self._events

    @property
    def pending(self) -> bool:
        """A decode request is outstanding."""
        return self._outstanding is not None

    @property
    def uncommitted_from(self) -> int | None:
        """Start of the earliest utterance not yet wholly committed, or None: every Final of speech that began
        before this sample has been emitted (after :meth:`receive_finalize`, poll it to know when a turn is done)."""
        for item in self._queue:
            if isinstance(item, _Utterance):
                return item.start
        return None

    @property
    def backlog_samples(self) -> int:
        """Speech audio received but not yet covered by any decode (how far the engine lags this stream)."""
        total = 0
        for item in self._queue:
            if isinstance(item, _Utterance):
                total += max(0, item.speech_end - max(item.decoded, item.committed))
        return total

    # --- inputs ----------------------------------------------------------------------------------------------------

    def receive_audio(self, samples: npt.ArrayLike) -> None:
        """Take the next float32 mono 16 kHz samples (any length, 0 included); then call :meth:`windows_to_decode`
        and :meth:`events_received`."""
        self._require_listening("receive_audio")
        x = np.asarray(samples, dtype=np.float32).reshape(-1)
        if x.size == 0:
            return
        self._buffer.append(x)
        self._received += x.size
        self._apply_vad(self._vad.process(x))
        self._advance()

    def receive_finalize(self) -> None:
        """The client wants the current utterance final now: close it at the speech received so far."""
        self._require_listening("receive_finalize")
        self._close_open(EndReason.FINALIZE)
        self._advance()

    def receive_configure(self, initial_prompt: str, keywords: tuple[str, ...]) -> None:
        """The session's prompt and keywords (:class:`~streamer.core.requests.DecodeOptions`) change: every window
        requested from now on is decoded with them; one already requested keeps the old ones. Raises
        :class:`~streamer.core.errors.ConfigError` naming what is invalid, and then changes nothing."""
        self._require_listening("receive_configure")
        decode = replace(self.options.decode, initial_prompt=initial_prompt, keywords=keywords)
        decode.validate()
        self.options = replace(self.options, decode=decode)

    def receive_end_of_stream(self) -> None:
        """No more audio: flush the VAD and close everything, however short. State becomes ENDING until done."""
        self._require_listening("receive_end_of_stream")
        self._apply_vad(self._vad.flush(), EndReason.END_OF_STREAM)
        self._close_open(EndReason.END_OF_STREAM)
        self._state = CoreState.ENDING
        self._advance()

    def windows_to_decode(self) -> list[DecodeRequest]:
        """The request the engine should run next for this stream: none while one is outstanding or none is due.

        A due window covers all speech not yet decoded (slow results coalesce into one larger window). Windows that
        would exceed ``max_window_ms`` commit what falls before them first.
        """
        if self._outstanding is not None:
            return []
        head = self._queue[0] if self._queue else None
        if not isinstance(head, _Utterance):
            return []
        policy = self._first_policy if not head.partial_text else self._policy
        window = next_window(policy, head.committed, head.decoded, head.speech_end, head.closed, head.anchor)
        if window is None:
            return []
        if window.start > head.committed:
            self._force_commit(head, window.start)
        options = self.options.decode
        if options.language is None and head.language is not None:
            # the utterance's language is settled: the windows that re-read it keep it (a short window could detect
            # another, and its words would never agree with the committed ones)
            options = replace(options, language=head.language)
        request = DecodeRequest(
            audio=self._buffer.slice(window.start, window.end),
            options=options,
            prompt=self._prompt(window.start),
            stream_id=self.stream_id,
            stream_offset=window.start,
            request_id=self._next_request_id,
        )
        self._next_request_id += 1
        self._outstanding = _Outstanding(request.request_id, window)
        head.decoded = window.end
        return [request]

    def receive_decode_result(self, result: DecodeResult) -> None:
        """The engine's answer to the outstanding request: commit agreed words (Final), show the rest (Partial)."""
        window = self._take_outstanding(result.request_id)
        head = self._queue[0]
        assert isinstance(head, _Utterance)
        heard = self._heard(result, window)
        words = self._words(heard, head)
        language = head.heard = result.language
        if window.final and window.end >= head.speech_end and head.closed:
            resume = self._resume_point(head, window, heard)
            if resume is not None:
                self._resume(head, words, resume, window.end, language)
            else:
                if not words and head.agreement.latest:
                    # the last window came back empty where the one before it heard words: tiny.en stopped after
                    # the context ("and it's like...") on a window that re-read the utterance before; keep what it
                    # heard
                    words = [w for w in head.agreement.latest if w.start >= head.committed]
                self._commit(head, words, head.speech_end, window.end, language)
                self._finish_head()
        else:
            # held: the utterance is still short enough to wait for its end point and be decoded whole
            hold = head.speech_end - head.committed <= self.options.commit_hold_ms * _MS
            agreement = head.agreement.update(words, window.end, commit=not hold)
            if hold:
                agreement = Agreement((), agreement.committed + agreement.tail)
            if agreement.committed:
                end = max(head.committed, min(window.end, agreement.committed[-1].end))
                self._commit(head, list(agreement.committed), end, window.end, language)
                self._move_anchor(head)
                if head.language is None:
                    head.language = language  # detected per utterance: fixed once its text starts to commit
            self._partial(head, list(agreement.tail), window.end, language)
        self._advance()

    def receive_decode_failure(self, request_id: int, reason: str) -> None:
        """The outstanding request failed: its audio can no longer be transcribed and is reported as Lost."""
        window = self._take_outstanding(request_id)
        head = self._queue[0]
        assert isinstance(head, _Utterance)
        end = max(head.committed, window.end)
        self._events.append(Lost(head.committed, end, reason))
        self._close_segment(head, end)
        head.agreement.reset()
        if head.closed and end >= head.speech_end:
            self._finish_head()
        self._advance()

    def events_received(self) -> list[Event]:
        """Drain the events produced since the last call, in stream order."""
        events, self._events = self._events, []
        return events

    # --- internals -------------------------------------------------------------------------------------------------

    def _require_listening(self, what: str) -> None:
        if self._state is not CoreState.LISTENING:
            raise InvalidState(f"{what}() in state {self._state.name}: the stream has already ended")

    def _take_outstanding(self, request_id: int) -> Window:
        if self._outstanding is None or self._outstanding.request_id != request_id:
            raise InvalidState(f"no outstanding decode request {request_id}")
        window = self._outstanding.window
        self._outstanding = None
        return window

    def _apply_vad(self, vad_events: list[VadSpan | SpeechEnd], end_reason: EndReason = EndReason.VAD) -> None:
        first = self._first
        for ev in vad_events:
            if first:  # the detector counts from this core's first sample, the stream from 0
                ev = (
                    SpeechEnd(ev.position + first)
                    if isinstance(ev, SpeechEnd)
                    else VadSpan(ev.start + first, ev.end + first, ev.speech)
                )
            if isinstance(ev, SpeechEnd):
                self._close_open(end_reason)
            elif ev.speech:
                if self._open is None:
                    # an utterance begun in replayed context is committed up to the origin already: its windows
                    # re-read it from its start, and the words before the origin are dropped (see _words)
                    committed = max(ev.start, self._origin)
                    self._open = _Utterance(ev.start, ev.start, committed, committed, anchor=self._anchor(ev.start))
                    self._open.agreement = self._commit_policy(ev.end)
                    self._queue.append(self._open)
                    if ev.start >= self._origin:  # else the client heard it start from the core before this one
                        self._events.append(SpeechStarted(ev.start))
                self._open.speech_end = ev.end
            else:
                start = max(ev.start, self._origin)  # non-speech before the origin is accounted for already
                if ev.end <= start:
                    continue
                last = self._queue[-1] if self._queue else None
                if isinstance(last, _Gap) and last.end == start:
                    last.end = ev.end
                else:
                    self._queue.append(_Gap(start, ev.end))

    def _anchor(self, start: int) -> int:
        """Where the windows of an utterance starting at ``start`` start: at most ``context_ms`` before it, at the
        first committed word there that begins a sentence (between it and the word before), or at ``start`` if none
        does. A window cut inside a word or a sentence derails the decoder: tiny.en wrote nothing at all for 3 s of
        speech after a window that started at "there" with the prompt "The boy was"."""
        context = self.options.context_ms * _MS
        if not context:
            return start
        words = self._committed_words
        first = next(
            (
                i
                for i, w in enumerate(words)
                if w.start >= start - context and w.end <= start and (i == 0 or words[i - 1].text.endswith(_ENDS))
            ),
            None,
        )
        if first is None:
            return start
        before = words[first - 1].end if first else words[first].start
        return max((before + words[first].start) // 2, self._buffer.start, self._first)

    def _commit_policy(self, heard: int) -> CommitPolicy:
        """The commit policy of an utterance the VAD reported at ``heard`` (auto measures its first window's wait from
        there: the window cannot come sooner)."""
        alignatt = AlignAtt(self.options.alignatt_margin_ms * _MS)
        if self.options.policy is Policy.ALIGNATT:
            return alignatt
        local = LocalAgreement(self.options.agreement_n, self.options.agreement_margin_ms * _MS)
        if self.options.policy is Policy.AUTO:
            gap = (self.options.step_ms + self.options.auto_wait_ms) * _MS
            return AutoCommit(local, alignatt, gap, heard)
        return local

    def _close_open(self, reason: EndReason) -> None:
        """Close the open utterance, if any, and say so before its last final."""
        if self._open is not None:
            self._open.closed = True
            if self._open.speech_end > self._origin:  # else it lies wholly in replayed context: not this core's
                self._events.append(SpeechEnded(self._open.start, self._open.speech_end, reason))
            self._open = None

    def _advance(self) -> None:
        """Release non-speech at the head of the queue, trim audio no one needs, and end when all is accounted."""
        ending = self._state is not CoreState.LISTENING
        while self._queue:
            head = self._queue[0]
            if isinstance(head, _Utterance):
                if head.closed and head.committed >= head.speech_end and self._outstanding is None:
                    self._finish_head()
                    continue
                break
            followed = len(self._queue) > 1
            if followed or ending or head.end - head.start >= self.options.nonspeech_report_ms * _MS:
                if head.end > head.start:
                    self._events.append(NonSpeech(head.start, head.end))
                if followed or ending:
                    self._queue.popleft()
                else:
                    head.start = head.end
                continue
            break
        # audio before where any queued utterance's windows start and before the VAD's undecided region is never
        # needed (less the context a next utterance's windows may start with). Every queued utterance counts, not
        # only the head: one queued behind it may have taken its context from words committed before the head's
        # start (the head's own windows may start later, at its start)
        keep = max(self._first, self._first + self._vad.decided - self.options.context_ms * _MS)
        for item in self._queue:
            if isinstance(item, _Utterance):
                keep = min(keep, item.anchor, item.committed)
        self._buffer.trim_before(keep)
        if ending and not self._queue and self._outstanding is None:
            self._state = CoreState.ENDED

    def _finish_head(self) -> None:
        self._queue.popleft()

    def _heard(self, result: DecodeResult, window: Window) -> list[Word]:
        """The result's words in stream time, after the guards (none when it is not trusted)."""
        guards = self.options.guards
        spoken = sum(1 for w in result.words if is_spoken(w.word))
        verdict = check_result(guards, result.no_speech_prob, result.avg_logprob, result.compression_ratio, spoken)
        if verdict is not Verdict.OK:
            return []
        words: list[Word] = []
        for w in result.words:
            text = w.word.strip()
            if not text:
                continue
            start = min(max(window.start + w.start, window.start), window.end)
            end = min(max(window.start + w.end, start), window.end)
            words.append(Word(text, start, end, w.probability))
        return words

    def _words(self, heard: list[Word], head: _Utterance) -> list[Word]:
        """The words heard that are not committed yet."""
        # a word mostly before the commit point was committed from an earlier window; a window that resumes where
        # the decoding stopped early keeps what it hears after its start in the utterance (the last committed word's
        # alignment may reach over speech no word was written for) and drops the committed words it re-reads by their
        # text
        since = head.committed if head.resume < 0 else max(head.start, min(head.committed, head.resume))
        words = [w for w in heard if (w.start + w.end) // 2 >= since and w.end > since]
        if head.committed > min(head.start, head.anchor):  # words were committed before the window's new audio
            words = strip_committed_overlap([w.text for w in self._committed_words[-5:]], words)
        return list(_truncate_loops(self.options.guards, words))

    def _resume_point(self, head: _Utterance, window: Window, heard: list[Word]) -> int | None:
        """Where the utterance's closing ``window`` should be decoded again from, because its words stop well before
        its speech does, or None: commit what it heard and the rest of the audio (``resume_after_ms``).

        It is the end of the window's last word but one: the decoder writes a word and stops, and DTW then stretches
        or moves that last word into the speech left unwritten (tiny.en put "and" 2 to 3 s after "one day," with
        "unluckily, fell asleep..." in between). Each resumption starts at least 300 ms after the window it follows,
        and an utterance resumes at most four times; a hypothesis cut for looping, or of one word, is committed as it
        is."""
        gap = self.options.resume_after_ms * _MS
        if not gap or head.resumes >= _MAX_RESUMES or len(heard) < 2:
            return None
        if head.speech_end - heard[-1].start <= gap or len(_truncate_loops(self.options.guards, heard)) < len(heard):
            return None
        resume = heard[-2].end
        # the committed words it re-reads are recognised by their text, as many as strip_committed_overlap compares
        committed = self._committed_words
        if len(committed) > _REREAD and committed[-_REREAD - 1].end > resume:
            resume = committed[-_REREAD - 1].end
        if not window.start + _RESUME_PROGRESS <= resume < head.speech_end:
            return None
        return resume

    def _resume(self, head: _Utterance, words: list[Word], resume: int, audio_end: int, language: str) -> None:
        """Commit the closing window's words before ``resume`` and decode the utterance again from there."""
        if resume > head.committed:
            self._commit(head, [w for w in words if w.end <= resume], resume, audio_end, language)
        head.anchor = head.resume = resume
        head.resumes += 1
        self._partial(head, [w for w in words if w.end > max(resume, head.committed)], audio_end, language)

    def _commit(self, head: _Utterance, words: list[Word], end: int, audio_end: int, language: str) -> None:
        start = head.committed
        end = max(end, start)
        clipped = tuple(_clip(w, start, end) for w in words)
        text = " ".join(w.text for w in clipped)
        self._events.append(Final(self._segment_id, text, start, end, clipped, audio_end, language))
        self._committed_words.extend(clipped)
        del self._committed_words[:-64]
        for word in clipped:
            if word.text.endswith(_ENDS):
                head.sentence_end = word.end
        self._close_segment(head, end)

    def _move_anchor(self, head: _Utterance) -> None:
        """Keep windows short enough: past ``trim_after_ms``, start them after the last committed sentence."""
        limit = self.options.trim_after_ms * _MS
        length = head.speech_end - head.anchor
        if length <= limit:
            return
        if head.anchor < head.sentence_end <= head.committed:
            head.anchor = head.sentence_end
        elif length > 2 * limit:
            head.anchor = head.committed

    def _close_segment(self, head: _Utterance, end: int) -> None:
        self._segment_id += 1
        head.partial_text = ""
        head.committed = end
        head.decoded = max(head.decoded, end)

    def _force_commit(self, head: _Utterance, until: int) -> None:
        """The window must start at ``until``: commit the latest hypothesis' words before it, and its audio."""
        words = [w for w in head.agreement.latest if w.end <= until]
        self._commit(head, words, until, head.decoded, head.heard)
        head.agreement.drop_before(until)
        head.anchor = max(head.anchor, until)

    def _partial(self, head: _Utterance, tail: list[Word], audio_end: int, language: str) -> None:
        text = " ".join(w.text for w in tail)
        if text == head.partial_text:
            return
        head.partial_text = text
        start = tail[0].start if tail else head.committed
        end = tail[-1].end if tail else head.committed
        self._events.append(Partial(self._segment_id, text, start, end, tuple(tail), audio_end, language))

    def _prompt(self, window_start: int) -> str:
        """Committed text spoken before the window: text the window itself re-reads must not be in the prompt,
        or the model takes it as already said and skips it."""
        if not self.options.condition_on_committed or self.options.prompt_max_chars == 0:
            return ""
        text = " ".join(w.text for w in self._committed_words if w.end <= window_start)
        limit = self.options.prompt_max_chars
        if len(text) <= limit:
            return text
        cut = text[-limit:]
        space = cut.find(" ")
        return cut[space + 1 :] if space >= 0 else cut
