"""How one stream is turned into transcript events: :class:`CoreOptions`, each field with the measured reason for its
default, validated in one place; :func:`for_the_model` adjusts them for the model that decodes the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from streamer.core.agreement import GuardOptions, Policy
from streamer.core.errors import ConfigError
from streamer.core.requests import MIN_ENCODER_PAD_SECONDS, DecodeOptions
from streamer.core.units import N_SAMPLES, SAMPLE_RATE
from streamer.core.vad import VadOptions

__all__ = [
    "CLOSE_AHEAD",
    "CLOSING_ENCODER_PAD_SECONDS",
    "CLOSING_TEMPERATURES",
    "LATE_CONTEXT_MS",
    "LATE_ENCODER_PAD_SECONDS",
    "STREAM_ENCODER_PAD_SECONDS",
    "CoreOptions",
    "for_the_model",
]

# the silence a streamed window's encoder reads after its audio (DecodeOptions.encoder_pad_seconds). `streamer bench
# accuracy` over the evaluation set (docs/benchmarks.md): 9.74 % streamed against 9.59 % offline, the first partial
# p50 in 0.19 s (0.51 s with the whole 30 s, which streamed 9.40 %); 6 s streamed 10.81 %
STREAM_ENCODER_PAD_SECONDS = 10.0
# a window that closes its utterance ends in the silence after the speech, not mid-word: with closing_like_offline it is
# decoded as `streamer transcribe` decodes a window (streamer.offline.transcribe.OFFLINE_ENCODER_PAD_SECONDS: 6 s of
# silence after the audio, 0.4 WER points better offline than the whole 30 s; Whisper's temperature fallback when the
# text fails its quality checks)
CLOSING_ENCODER_PAD_SECONDS = 6.0
CLOSING_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
# what a late window (CoreOptions.late_context_ms) reads: as much as any other by default. On the tuning half at real
# time, 8 streams staggered (docs/benchmarks.md, "Late windows"), 3 s of context and a 4 s pad cut the final delay p95
# from 2.05 to 1.86 s but streamed 12.81 % against 9.27 % (3 s of context alone: 1.92 s, 10.35 %)
LATE_CONTEXT_MS = 10000
LATE_ENCODER_PAD_SECONDS: float | None = None
# decode an utterance's closing window when its speech pauses, ahead of its end point (CoreOptions.close_ahead). Chosen
# on the tuning half at real time, 8 streams staggered on 2 workers, Zen 4 EPYC, the same hour (docs/benchmarks.md,
# "Closing windows decoded when the speech pauses"): final delay p50 / p95 1.22 / 1.71 s against 1.23 / 1.78 s, the
# server's share p95 1.01 against 1.09 s, streamed WER 9.50 against 9.54 %, 5,140 windows against 5,210
CLOSE_AHEAD = True
# a window trimmed mid-sentence (past twice trim_after_ms) starts at a committed word this long before the commit point
TRIM_CONTEXT_MS = 0

_MS = SAMPLE_RATE // 1000


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
    # the window that closes an utterance is decoded as offline decodes one (CLOSING_ENCODER_PAD_SECONDS of silence
    # after its audio, the CLOSING_TEMPERATURES fallback); the other windows as `decode` says
    closing_like_offline: bool = False
    # the window that would close an utterance is decoded once its speech pauses (pad_after_ms into the silence: the
    # VAD's speech span has stopped growing), not once the end point (endpoint_ms) has closed it: if the end point
    # then comes with no more speech, that window's words close the utterance without a decode of their own, and its
    # final waits for no engine (CLOSE_AHEAD). A pause that is not an end point costs that window (a partial update).
    # Not with closing_like_offline, whose closing window is decoded otherwise
    close_ahead: bool = CLOSE_AHEAD
    # the longest window sent to the engine (the model's 30 s input)
    max_window_ms: int = N_SAMPLES // _MS
    # an utterance's windows start up to this long before it, at the first word committed there: Whisper hears what
    # led up to it, as offline; the words re-read there are committed already and dropped from its hypotheses (0:
    # windows start at the utterance)
    context_ms: int = 10000
    # a late window (its stream waited for a busy engine: it ends more than a step and auto_wait_ms after the
    # stream's previous window) reads at most this much context before its utterance, and its encoder reads
    # late_encoder_pad_seconds of silence after its audio (None: as the other windows): under a backlog each window
    # costs less, so the engine catches up sooner, at a cost in accuracy. Off by default (as much as any window):
    # on the tuning half the delay it saved cost 1.8 to 4.2 WER points (LATE_CONTEXT_MS)
    late_context_ms: int = LATE_CONTEXT_MS
    late_encoder_pad_seconds: float | None = LATE_ENCODER_PAD_SECONDS
    # at most this many characters of recent committed text are sent as the prompt
    prompt_max_chars: int = 200
    # condition each window on the committed text before it (whisper's condition_on_previous_text)
    condition_on_committed: bool = True
    # non-speech is reported at least this often during long silences
    nonspeech_report_ms: int = 1000
    # windows re-read the utterance from its start (or the last trim point) for context; once a window is longer
    # than this, its start moves to the end of the last committed sentence (or, past twice this, to a committed word
    # at most trim_context_ms before the commit point)
    trim_after_ms: int = 10000
    trim_context_ms: int = TRIM_CONTEXT_MS
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
        if not 0 <= self.late_context_ms <= 10000:
            raise ConfigError("late_context_ms must be between 0 and 10000")
        late_pad = self.late_encoder_pad_seconds
        if late_pad is not None and not MIN_ENCODER_PAD_SECONDS <= late_pad <= 30:
            raise ConfigError(f"late_encoder_pad_seconds must be between {MIN_ENCODER_PAD_SECONDS:g} and 30 (or None)")
        if not 0 <= self.prompt_max_chars <= 1000:
            raise ConfigError("prompt_max_chars must be between 0 and 1000")
        if not self.step_ms <= self.trim_after_ms <= self.max_window_ms:
            raise ConfigError("trim_after_ms must be between step_ms and max_window_ms")
        if not 0 <= self.trim_context_ms <= self.trim_after_ms:
            raise ConfigError("trim_context_ms must be between 0 and trim_after_ms")
        if self.nonspeech_report_ms < 100:
            raise ConfigError("nonspeech_report_ms must be >= 100")
        if not self.decode.word_timestamps:
            raise ConfigError("streaming needs word_timestamps")


def for_the_model(options: CoreOptions, multilingual: bool) -> CoreOptions:
    """``options`` as a stream decoded by this model must use them; every runner calls it before making a core
    (the session, the call pipeline, the benchmarks' simulator and ``bench gains``).

    A multilingual model that detects each utterance's language (``decode.language`` None) gets no context from
    the utterances before (``context_ms`` 0): a window that starts in German makes Whisper detect German for the
    French that follows, and write the French as German."""
    if multilingual and options.decode.language is None and (options.context_ms or options.late_context_ms):
        return replace(options, context_ms=0, late_context_ms=0)
    return options
