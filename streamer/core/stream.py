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

Its parts: :class:`~streamer.core.options.CoreOptions` say how (made with :func:`~streamer.core.options.for_the_model`),
a :class:`~streamer.core.origin.StreamOrigin` where a core taking a stream over starts; the core queues
:mod:`~streamer.core.utterance` items in stream order, reads each result with :mod:`streamer.core.decoded_words`, and
decodes each window with the :mod:`~streamer.core.context` of the words committed before it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np
import numpy.typing as npt

from streamer.core.agreement import Agreement, AlignAtt, AutoCommit, CommitPolicy, LocalAgreement, Policy
from streamer.core.context import ends_sentence, prompt_before, sentence_start_before
from streamer.core.decoded_words import clip, new_words, resume_point, words_heard
from streamer.core.errors import InvalidState
from streamer.core.events import (
    CommitRoute,
    EndReason,
    Event,
    Final,
    Lost,
    NonSpeech,
    Partial,
    SpeechEnded,
    SpeechStarted,
    Word,
)
from streamer.core.options import CLOSING_ENCODER_PAD_SECONDS, CLOSING_TEMPERATURES, CoreOptions
from streamer.core.origin import StreamOrigin
from streamer.core.requests import DecodeOptions, DecodeRequest, DecodeResult, StreamId
from streamer.core.units import SAMPLE_RATE
from streamer.core.utterance import Gap, Heard, Utterance
from streamer.core.vad import (
    ClassifierFactory,
    SpeechEnd,
    VadBackend,
    VadSpan,
    VoiceActivityDetector,
    make_classifier,
)
from streamer.core.windowing import AudioBuffer, Window, WindowPolicy, next_window

__all__ = ["OPENING_LIMIT_MS", "CoreState", "StreamCore"]

_MS = SAMPLE_RATE // 1000
# a segment's windows stop being opening ones (StreamCore.opening_due) once this much of its speech has been decoded
# without words: speech shows its first words within a window or two (first_step_ms: 0.3 to 0.6 s, more when a
# busy engine coalesced them), while noise or babble the VAD let through may never show any, and would otherwise keep
# the scheduler's priority for opening windows (and its smaller batches) for as long as it lasts
OPENING_LIMIT_MS = 2000


class CoreState(Enum):
    LISTENING = "listening"  # audio is accepted
    ENDING = "ending"  # end of stream received; decodes still to run or events to drain
    ENDED = "ended"  # everything decided; events may remain until drained


@dataclass(frozen=True)
class _Outstanding:
    request_id: int
    window: Window
    # asked for once its utterance's speech paused (CoreOptions.close_ahead): it closes the utterance if the end point
    # comes with no more speech
    ahead: bool = False


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
        self._queue: deque[Utterance | Gap] = deque()  # stream order; the head is the next to account
        self._open: Utterance | None = None  # the utterance speech is joining
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
        return isinstance(head, Utterance) and head.closed and head.speech_end > head.committed

    @property
    def opening_due(self) -> bool:
        """Whether :meth:`windows_to_decode` would now offer a window whose partial is the first text the speaker sees
        of the segment being decoded (an utterance's start, or the speech after a commit): no words shown yet, the
        utterance still open, and less than :data:`OPENING_LIMIT_MS` of the segment's speech decoded without words."""
        if self._outstanding is not None or not self._queue:
            return False
        head = self._queue[0]
        if not isinstance(head, Utterance) or head.closed or head.partial_text:
            return False
        if head.decoded - head.committed >= OPENING_LIMIT_MS * _MS:
            return False
        return self._due_window(head) is not None

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
            if isinstance(item, Utterance):
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
            if isinstance(item, Utterance):
                return item.start
        return None

    @property
    def backlog_samples(self) -> int:
        """Speech audio received but not yet covered by any decode (how far the engine lags this stream)."""
        total = 0
        for item in self._queue:
            if isinstance(item, Utterance):
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
        if not isinstance(head, Utterance):
            return []
        window = self._due_window(head)
        if window is None:
            return []
        if window.start > head.committed:
            self._force_commit(head, window.start)
        late = window.end - max(head.paced, head.decoded) > self._waited
        options = self.options.decode
        if late:
            window, options = self._late(head, window, options)
        if options.language is None and head.language is not None:
            # the utterance's language is settled: the windows that re-read it keep it (a short window could detect
            # another, and its words would never agree with the committed ones)
            options = replace(options, language=head.language)
        if window.final and self.options.closing_like_offline:
            options = replace(
                options, temperatures=CLOSING_TEMPERATURES, encoder_pad_seconds=CLOSING_ENCODER_PAD_SECONDS
            )
        request = DecodeRequest(
            audio=self._buffer.slice(window.start, window.end),
            options=options,
            prompt=self._prompt(window.start),
            stream_id=self.stream_id,
            stream_offset=window.start,
            request_id=self._next_request_id,
        )
        self._next_request_id += 1
        self._outstanding = _Outstanding(request.request_id, window, self._paused(head))
        head.decoded = head.paced = window.end
        return [request]

    def _due_window(self, head: Utterance) -> Window | None:
        """The window of ``head`` due now (None: none is), stepped by first_step_ms until it shows words."""
        policy = self._first_policy if not head.partial_text else self._policy
        paused = self._paused(head)
        return next_window(policy, head.committed, head.decoded, head.speech_end, head.closed, head.anchor, paused)

    def _paused(self, head: Utterance) -> bool:
        """Whether ``head``'s speech has paused, with close_ahead: its windows close it ahead of its end point."""
        return self._close_ahead and head is self._open and self._vad.paused

    @property
    def _close_ahead(self) -> bool:
        """Whether windows close utterances ahead of their end points (:attr:`CoreOptions.close_ahead`)."""
        return self.options.close_ahead and not self.options.closing_like_offline

    def _late(self, head: Utterance, window: Window, options: DecodeOptions) -> tuple[Window, DecodeOptions]:
        """A late window (:attr:`CoreOptions.late_context_ms`) and its decode options: at most ``late_context_ms``
        of context before the utterance (from a committed sentence's start, as :meth:`_anchor`), and
        ``late_encoder_pad_seconds`` of silence after its audio. Its start stays at or before the utterance's, so it
        commits nothing early."""
        late_pad = self.options.late_encoder_pad_seconds
        if late_pad is not None and (options.encoder_pad_seconds is None or late_pad < options.encoder_pad_seconds):
            options = replace(options, encoder_pad_seconds=late_pad)
        if window.start < head.start and self.options.late_context_ms < self.options.context_ms:
            start = self._anchor(head.start, self.options.late_context_ms)
            if start > window.start:
                window = Window(start, window.end, window.final)
        return window, options

    def receive_decode_result(self, result: DecodeResult) -> None:
        """The engine's answer to the outstanding request: commit agreed words (Final), show the rest (Partial)."""
        taken = self._take_outstanding(result.request_id)
        window = taken.window
        head = self._queue[0]
        assert isinstance(head, Utterance)
        heard = Heard(window, tuple(words_heard(result, window, self.options.guards)), result.language)
        language = head.heard = result.language
        if head.closed and self._closes(head, window, taken.ahead):
            self._close(head, heard)
            return self._advance()
        words = new_words(list(heard.words), head, self._committed_words, self.options.guards)
        # close_ahead: a window asked for when the speech paused, and none has come since: if the end point comes with
        # no more speech it closes the utterance (_advance), so its words wait for that, uncommitted
        covering = taken.ahead and window.end >= head.speech_end
        head.covered = heard if covering else None
        if covering and not words and head.agreement.latest:
            # it came back empty where the window before it heard words: keep their hypothesis, as _close does
            return self._advance()
        # held: the utterance is still short enough to wait for its end point and be decoded whole
        hold = covering or head.speech_end - head.committed <= self.options.commit_hold_ms * _MS
        agreement = head.agreement.update(words, window.end, commit=not hold)
        if hold:
            agreement = Agreement((), agreement.committed + agreement.tail)
        if agreement.committed:
            end = max(head.committed, min(window.end, agreement.committed[-1].end))
            self._commit(head, list(agreement.committed), end, window.end, language, CommitRoute.AGREED)
            head.move_anchor(
                self.options.trim_after_ms * _MS, self._committed_words, self.options.trim_context_ms * _MS
            )
            if head.language is None:
                head.language = language  # detected per utterance: fixed once its text starts to commit
        self._partial(head, list(agreement.tail), window.end, language)
        self._advance()

    def _closes(self, head: Utterance, window: Window, ahead: bool) -> bool:
        """Whether ``window``, decoded for the closed ``head``, closes it: it covers all of its speech, and it is the
        closing window or (``ahead``) one asked for once its speech paused, with close_ahead."""
        return window.end >= head.speech_end and (window.final or ahead)

    def _close(self, head: Utterance, heard: Heard) -> None:
        """Commit the closed ``head``'s words from the window that covers all of its speech, and the rest of its audio;
        or, where that window stopped early, what comes before and decode it again from there
        (:func:`~streamer.core.decoded_words.resume_point`)."""
        window, language = heard.window, heard.language
        words = new_words(list(heard.words), head, self._committed_words, self.options.guards)
        resume_after = self.options.resume_after_ms * _MS
        resume = resume_point(head, window, list(heard.words), self._committed_words, resume_after, self.options.guards)
        if resume is not None:
            self._resume(head, words, resume, window.end, language)
            return
        if not words and head.agreement.latest:
            # the last window came back empty where the one before it heard words: tiny.en stopped after the context
            # ("and it's like...") on a window that re-read the utterance before; keep what it heard
            words = [w for w in head.agreement.latest if w.start >= head.committed]
        self._commit(head, words, head.speech_end, window.end, language, CommitRoute.END_POINT)
        self._finish_head()

    def receive_decode_failure(self, request_id: int, reason: str) -> None:
        """The outstanding request failed: its audio can no longer be transcribed and is reported as Lost."""
        window = self._take_outstanding(request_id).window
        head = self._queue[0]
        assert isinstance(head, Utterance)
        head.covered = None
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

    def _take_outstanding(self, request_id: int) -> _Outstanding:
        if self._outstanding is None or self._outstanding.request_id != request_id:
            raise InvalidState(f"no outstanding decode request {request_id}")
        taken, self._outstanding = self._outstanding, None
        return taken

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
                    self._open = Utterance(
                        ev.start, ev.start, committed, committed, paced=ev.end, anchor=self._anchor(ev.start)
                    )
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
                if isinstance(last, Gap) and last.end == start:
                    last.end = ev.end
                else:
                    self._queue.append(Gap(start, ev.end))

    def _anchor(self, start: int, context_ms: int | None = None) -> int:
        """Where the windows of an utterance starting at ``start`` start: at most ``context_ms`` (default: the
        options') before it, at the first committed word there that begins a sentence (see
        :func:`~streamer.core.context.sentence_start_before`), or at ``start`` if none does."""
        context = (self.options.context_ms if context_ms is None else context_ms) * _MS
        if not context:
            return start
        point = sentence_start_before(self._committed_words, start, context)
        if point is None:
            return start
        return max(point, self._buffer.start, self._first)

    @property
    def _waited(self) -> int:
        """A window that ends more than this many samples after its stream's previous one (the first: after its
        utterance was heard) waited for a busy engine: the auto policy commits it by AlignAtt, and it is late
        (CoreOptions.late_context_ms)."""
        return (self.options.step_ms + self.options.auto_wait_ms) * _MS

    def _commit_policy(self, heard: int) -> CommitPolicy:
        """The commit policy of an utterance the VAD reported at ``heard`` (auto measures its first window's wait from
        there: the window cannot come sooner)."""
        alignatt = AlignAtt(self.options.alignatt_margin_ms * _MS)
        if self.options.policy is Policy.ALIGNATT:
            return alignatt
        local = LocalAgreement(self.options.agreement_n, self.options.agreement_margin_ms * _MS)
        if self.options.policy is Policy.AUTO:
            return AutoCommit(local, alignatt, self._waited, heard)
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
            if isinstance(head, Utterance):
                if head.closed and self._outstanding is None:
                    if head.committed >= head.speech_end:
                        self._finish_head()
                        continue
                    covered, head.covered = head.covered, None
                    if covered is not None and self._closes(head, covered.window, ahead=True):
                        # close_ahead: the window decoded when its speech paused covers it all; it needs no other
                        self._close(head, covered)
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
            if isinstance(item, Utterance):
                keep = min(keep, item.anchor, item.committed)
        self._buffer.trim_before(keep)
        if ending and not self._queue and self._outstanding is None:
            self._state = CoreState.ENDED

    def _finish_head(self) -> None:
        self._queue.popleft()

    def _resume(self, head: Utterance, words: list[Word], resume: int, audio_end: int, language: str) -> None:
        """Commit the closing window's words before ``resume`` and decode the utterance again from there."""
        if resume > head.committed:
            kept = [w for w in words if w.end <= resume]
            self._commit(head, kept, resume, audio_end, language, CommitRoute.RESUMED)
        head.anchor = head.resume = resume
        head.resumes += 1
        self._partial(head, [w for w in words if w.end > max(resume, head.committed)], audio_end, language)

    def _commit(
        self, head: Utterance, words: list[Word], end: int, audio_end: int, language: str, route: CommitRoute
    ) -> None:
        start = head.committed
        end = max(end, start)
        clipped = tuple(clip(w, start, end) for w in words)
        text = " ".join(w.text for w in clipped)
        self._events.append(Final(self._segment_id, text, start, end, clipped, audio_end, language, route))
        self._committed_words.extend(clipped)
        del self._committed_words[:-64]
        for word in clipped:
            if ends_sentence(word):
                head.sentence_end = word.end
        self._close_segment(head, end)

    def _close_segment(self, head: Utterance, end: int) -> None:
        self._segment_id += 1
        head.partial_text = ""
        head.committed = end
        head.decoded = max(head.decoded, end)

    def _force_commit(self, head: Utterance, until: int) -> None:
        """The window must start at ``until``: commit the latest hypothesis' words before it, and its audio."""
        words = [w for w in head.agreement.latest if w.end <= until]
        self._commit(head, words, until, head.decoded, head.heard, CommitRoute.WINDOW_LIMIT)
        head.agreement.drop_before(until)
        head.anchor = max(head.anchor, until)

    def _partial(self, head: Utterance, tail: list[Word], audio_end: int, language: str) -> None:
        text = " ".join(w.text for w in tail)
        if text == head.partial_text:
            return
        head.partial_text = text
        start = tail[0].start if tail else head.committed
        end = tail[-1].end if tail else head.committed
        self._events.append(Partial(self._segment_id, text, start, end, tuple(tail), audio_end, language))

    def _prompt(self, window_start: int) -> str:
        """Committed text spoken before the window (see :func:`~streamer.core.context.prompt_before`)."""
        if not self.options.condition_on_committed:
            return ""
        return prompt_before(self._committed_words, window_start, self.options.prompt_max_chars)
