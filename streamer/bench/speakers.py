"""Speaker labels measured offline on synthetic LibriSpeech conversations (issue 40): word attribution, speaker
count and DER, the tracker's defaults chosen on the tuning half of the speakers and reported on the other.

``python -m streamer.bench.speakers`` (``--count``, ``--seed``; ``--tune`` sweeps the windows and thresholds on the
tuning half first and reports the best next to the defaults). Each conversation
(:mod:`streamer.bench.conversations`) goes through the pipeline the server is to run, offline:

1. speech: the core's VAD (:data:`VAD`: webrtc, short padding) over the whole mix;
2. windows: :func:`~streamer.core.speakers.plan_windows`, embedded by the voice encoder in one batch;
3. labels: :class:`~streamer.core.speakers.SpeakerTracker`, window by window in stream order;
4. words: the reference words (at their spread times) given speakers by
   :func:`~streamer.core.speakers.assign_words`; frames likewise: every 10 ms frame of the VAD's speech is a "word",
   so a change of speaker moves to the longest VAD pause near it.

The scores:

- **word attribution**: the share of reference words whose speaker is right under the best one-to-one mapping of
  the conversation's labels to its speakers (a label left unmapped is wrong);
- **speaker count**: the tracker's number of speakers equals the conversation's;
- **DER** (ours, frame-level, NIST's definition as pyannote.metrics computes it with ``collar=0.5``,
  ``skip_overlap=True``): 10 ms frames; frames within 0.25 s of a reference turn's start or end and frames where the
  reference has two voices are not scored; of the rest, DER = (missed speech + false alarm + confusion) / reference
  speech, confusion under the one-to-one mapping of labels to speakers that maximises their common frames;
- **CPU**: the process CPU seconds the encoder (features and network, torch on one thread) takes per second of
  audio, and per window.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from streamer.bench.conversations import Conversation, ReferenceWord, build_conversations, real_conversations
from streamer.core.diarization import SPEAKER_VAD
from streamer.core.errors import ConfigError
from streamer.core.speakers import (
    SpeakerOptions,
    SpeakerTracker,
    SpeechSpan,
    WindowLabel,
    assign_words,
    plan_windows,
)
from streamer.core.units import SAMPLE_RATE
from streamer.core.vad import SpeechEnd, VadOptions, VoiceActivityDetector

if TYPE_CHECKING:  # the encoder (torch) is imported when a run needs it
    from streamer.engine.speaker_encoder import SpeakerEncoder

__all__ = [
    "FRAME",
    "VAD",
    "DerScore",
    "Diarized",
    "EmbeddedConversation",
    "Frame",
    "LivePooled",
    "LiveRun",
    "Score",
    "SpeakerSegment",
    "best_mapping",
    "diarization_error",
    "diarize",
    "diarize_live",
    "embed_conversation",
    "main",
    "pool_live",
    "pyannote_error",
    "score",
    "segment_frames",
    "speech_spans",
    "word_attribution",
]

FRAME = SAMPLE_RATE // 100  # DER's 10 ms frames
COLLAR = SAMPLE_RATE // 4  # 0.25 s either side of a reference boundary is not scored
# the speech the windows and frames come from: the live diarizer's (the core's webrtc VAD with short padding, no
# energy gate; the stream's 500 ms before speech would add a quarter second of false alarm at every turn, past the
# collar)
VAD = SPEAKER_VAD


@dataclass(frozen=True)
class Frame:
    """A 10 ms frame of detected speech, a "word" for :func:`~streamer.core.speakers.assign_words`."""

    start: int
    end: int


@dataclass(frozen=True)
class EmbeddedConversation:
    """A conversation's windows embedded once, to be tracked under many options."""

    conversation: Conversation
    speech: tuple[SpeechSpan, ...]
    starts: tuple[int, ...]
    embeddings: npt.NDArray[np.float32]
    cpu_seconds: float  # the encoder's process CPU time for these windows


@dataclass(frozen=True)
class Diarized:
    labels: tuple[WindowLabel, ...]
    speakers: int
    word_speakers: tuple[int | None, ...]  # per conversation.words
    frames: tuple[Frame, ...]
    frame_speakers: tuple[int | None, ...]


@dataclass(frozen=True)
class DerScore:
    scored: int  # reference speech frames scored
    missed: int
    false_alarm: int
    confusion: int

    @property
    def der(self) -> float:
        return (self.missed + self.false_alarm + self.confusion) / self.scored if self.scored else 0.0

    def __add__(self, other: DerScore) -> DerScore:
        return DerScore(
            self.scored + other.scored,
            self.missed + other.missed,
            self.false_alarm + other.false_alarm,
            self.confusion + other.confusion,
        )


@dataclass(frozen=True)
class Score:
    name: str
    seconds: float
    speakers: int  # in the reference
    found: int  # by the tracker
    words: int
    words_right: int
    der: DerScore
    windows: int
    cpu_seconds: float

    @property
    def attribution(self) -> float:
        return self.words_right / self.words if self.words else 1.0


def speech_spans(samples: npt.NDArray[np.float32], options: VadOptions = VAD) -> list[SpeechSpan]:
    """The speech of ``samples`` by the core's VAD, contiguous spans merged."""
    detector = VoiceActivityDetector(options)
    events = [*detector.process(samples), *detector.flush()]
    spans: list[SpeechSpan] = []
    for event in events:
        if isinstance(event, SpeechEnd) or not event.speech:
            continue
        if spans and spans[-1].end == event.start:
            spans[-1] = SpeechSpan(spans[-1].start, event.end)
        else:
            spans.append(SpeechSpan(event.start, event.end))
    return spans


def embed_conversation(
    conversation: Conversation, encoder: SpeakerEncoder, options: SpeakerOptions
) -> EmbeddedConversation:
    """Plan ``conversation``'s windows by ``options`` (window, step, speech share) and embed them."""
    speech = tuple(speech_spans(conversation.samples))
    starts = plan_windows(speech, 0, len(conversation.samples), options)
    windows = np.zeros((len(starts), options.window_samples), dtype=np.float32)
    for row, start in zip(windows, starts, strict=True):
        row[:] = conversation.samples[start : start + options.window_samples]
    before = time.process_time()
    embeddings = encoder.embed_windows(windows)
    cpu = time.process_time() - before
    return EmbeddedConversation(conversation, speech, tuple(starts), embeddings, cpu)


def diarize(embedded: EmbeddedConversation, options: SpeakerOptions) -> Diarized:
    """Track ``embedded``'s windows under ``options`` (window and step must be those it was embedded with) and give
    the reference words and the speech frames speakers."""
    tracker = SpeakerTracker(options)
    for start, embedding in zip(embedded.starts, embedded.embeddings, strict=True):
        tracker.receive_window(start, start + options.window_samples, embedding)
    labels = tracker.labels()
    words = embedded.conversation.words
    frames = [Frame(f, f + FRAME) for span in embedded.speech for f in range(span.start, span.end - FRAME + 1, FRAME)]
    return Diarized(
        tuple(labels),
        tracker.speakers,
        tuple(assign_words(words, labels, options.step_samples)),
        tuple(frames),
        tuple(assign_words(frames, labels, options.step_samples)),
    )


def best_mapping(common: npt.NDArray[np.int64]) -> dict[int, int]:
    """The one-to-one mapping of hypothesis labels (rows) to reference speakers (columns) that maximises the summed
    ``common`` counts (exhaustive: a conversation has a handful of each)."""
    rows, cols = common.shape
    best: tuple[int, dict[int, int]] = (-1, {})
    if rows <= cols:
        for perm in itertools.permutations(range(cols), rows):
            total = int(sum(common[r, c] for r, c in enumerate(perm)))
            if total > best[0]:
                best = (total, dict(enumerate(perm)))
    else:
        for perm in itertools.permutations(range(rows), cols):
            total = int(sum(common[r, c] for c, r in enumerate(perm)))
            if total > best[0]:
                best = (total, {r: c for c, r in enumerate(perm)})
    return best[1]


def word_attribution(words: Sequence[ReferenceWord], speakers: Sequence[int | None]) -> int:
    """How many of ``words`` have the right speaker under the best one-to-one mapping of labels to speakers."""
    names = sorted({w.speaker for w in words})
    labels = sorted({s for s in speakers if s is not None})
    if not labels:
        return 0
    common = np.zeros((len(labels), len(names)), dtype=np.int64)
    for word, label in zip(words, speakers, strict=True):
        if label is not None:
            common[labels.index(label), names.index(word.speaker)] += 1
    mapping = best_mapping(common)
    return sum(int(common[r, c]) for r, c in mapping.items())


def diarization_error(conversation: Conversation, frames: Sequence[Frame], speakers: Sequence[int | None]) -> DerScore:
    """Frame-level DER of labelled speech ``frames`` against ``conversation``'s turns (see the module docstring)."""
    n = len(conversation.samples) // FRAME
    names = list(conversation.speakers)
    reference = np.zeros((n, len(names)), dtype=bool)
    scored = np.ones(n, dtype=bool)
    collar = COLLAR // FRAME
    for turn in conversation.turns:
        first, last = turn.start // FRAME, min(n, -(-turn.end // FRAME))
        reference[first:last, names.index(turn.speaker)] = True
        for edge in (first, last):
            scored[max(0, edge - collar) : edge + collar] = False
    scored &= reference.sum(axis=1) <= 1
    labels = sorted({s for s in speakers if s is not None})
    hypothesis = np.full(n, -1, dtype=np.int64)
    for frame, label in zip(frames, speakers, strict=True):
        if label is not None and frame.start // FRAME < n:
            hypothesis[frame.start // FRAME] = labels.index(label)
    ref_speech = reference.any(axis=1) & scored
    hyp_speech = (hypothesis >= 0) & scored
    truth = np.where(reference.any(axis=1), reference.argmax(axis=1), -1)
    common = np.zeros((max(1, len(labels)), len(names)), dtype=np.int64)
    both = ref_speech & hyp_speech
    np.add.at(common, (hypothesis[both], truth[both]), 1)
    mapping = best_mapping(common) if labels else {}
    mapped = np.array([mapping.get(int(h), -2) for h in hypothesis[both]], dtype=np.int64)
    return DerScore(
        scored=int(ref_speech.sum()),
        missed=int((ref_speech & ~hyp_speech).sum()),
        false_alarm=int((hyp_speech & ~ref_speech).sum()),
        confusion=int((mapped != truth[both]).sum()),
    )


@dataclass(frozen=True)
class SpeakerSegment:
    """A hypothesis turn: ``[start, end)`` samples said by ``label``."""

    start: int
    end: int
    label: int


def segment_frames(segments: Sequence[SpeakerSegment]) -> tuple[list[Frame], list[int | None]]:
    """``segments`` as the 10 ms frames and labels :func:`diarization_error` scores."""
    frames = [(Frame(f, f + FRAME), s.label) for s in segments for f in range(s.start, s.end, FRAME)]
    return [f for f, _ in frames], [label for _, label in frames]


def pyannote_error(conversation: Conversation, segments: Sequence[SpeakerSegment]) -> DerScore | None:
    """The DER of ``segments`` by pyannote.metrics (``DiarizationErrorRate(collar=0.5, skip_overlap=True)``: 0.25 s
    either side of a reference boundary unscored, as ours), in 10 ms frames so that it pools like ours; None where
    the package is not installed (``pip install pyannote.metrics``, in the bench and test extras)."""
    try:
        from pyannote.core import Annotation, Segment, Timeline
        from pyannote.metrics.diarization import DiarizationErrorRate
    except ImportError:
        return None
    reference, hypothesis = Annotation(), Annotation()
    for i, turn in enumerate(conversation.turns):
        reference[Segment(turn.start / SAMPLE_RATE, turn.end / SAMPLE_RATE), i] = turn.speaker
    for i, segment in enumerate(segments):
        hypothesis[Segment(segment.start / SAMPLE_RATE, segment.end / SAMPLE_RATE), i] = f"h{segment.label}"
    metric = DiarizationErrorRate(collar=2 * COLLAR / SAMPLE_RATE, skip_overlap=True)
    uem = Timeline([Segment(0.0, conversation.seconds)])
    detail = metric(reference, hypothesis, uem=uem, detailed=True)
    frames = SAMPLE_RATE / FRAME
    return DerScore(
        scored=round(detail["total"] * frames),
        missed=round(detail["missed detection"] * frames),
        false_alarm=round(detail["false alarm"] * frames),
        confusion=round(detail["confusion"] * frames),
    )


def score(embedded: EmbeddedConversation, options: SpeakerOptions) -> Score:
    """Diarize ``embedded`` under ``options`` and score it."""
    result = diarize(embedded, options)
    conversation = embedded.conversation
    words = conversation.words
    return Score(
        name=conversation.name,
        seconds=conversation.seconds,
        speakers=len(conversation.speakers),
        found=result.speakers,
        words=len(words),
        words_right=word_attribution(words, result.word_speakers),
        der=diarization_error(conversation, result.frames, result.frame_speakers),
        windows=len(embedded.starts),
        cpu_seconds=embedded.cpu_seconds,
    )


# what the live run offers a turn's final after its last word: the stream core's end point (500 ms of silence)
ENDPOINT_SAMPLES = SAMPLE_RATE // 2
LIVE_CHUNK = SAMPLE_RATE // 10  # 100 ms chunks, as clients send


@dataclass(frozen=True)
class LiveRun:
    """A conversation through :class:`~streamer.core.diarization.ChannelDiarizer` as a live channel runs it."""

    conversation: Conversation
    # the reference words in conversation order and the speakers their finals gave them
    words: tuple[ReferenceWord, ...]
    word_speakers: tuple[int | None, ...]
    speakers: int
    # per final: how long (samples of stream time) it waited for its labels after the core had it
    holds: tuple[int, ...]


def diarize_live(
    conversation: Conversation,
    encoder: SpeakerEncoder,
    options: SpeakerOptions,
    lookahead_ms: int | None = None,
    decode_ms: int = 0,
) -> LiveRun:
    """Stream ``conversation`` in 100 ms chunks through a channel's diarizer, embedding each chunk's windows at once
    (an idle encoder), and offer each turn's words as one final :data:`ENDPOINT_SAMPLES` and ``decode_ms`` after
    its last word (the core's end point, then the decode of its last window). The stream time each final then
    waits is its hold: what labels add to its delay."""
    from streamer.core.diarization import ChannelDiarizer
    from streamer.core.events import Final, Word

    diarizer = ChannelDiarizer(options, lookahead_ms=lookahead_ms)
    turns = sorted(conversation.turns, key=lambda t: t.end)
    after = ENDPOINT_SAMPLES + decode_ms * SAMPLE_RATE // 1000
    offers = [(t.end + after, segment, t) for segment, t in enumerate(turns)]
    offered: dict[int, int] = {}
    labelled: dict[int, tuple[int | None, ...]] = {}
    holds: list[int] = []
    samples = conversation.samples

    def step(position: int) -> None:
        requests = diarizer.windows_to_embed()
        if requests:
            diarizer.receive_embeddings(requests, encoder.embed_windows(np.stack([r.audio for r in requests])))
        while offers and offers[0][0] <= position:
            _, segment, turn = offers.pop(0)
            words = tuple(Word(w.text, w.start, w.end, 1.0) for w in turn.words)
            offered[segment] = position
            diarizer.receive_events([Final(segment, "", turn.start, turn.end, words, turn.end)])
        for event in diarizer.events_received():
            if isinstance(event, Final):
                labelled[event.segment_id] = tuple(w.speaker for w in event.words)
                holds.append(position - offered[event.segment_id])

    for start in range(0, len(samples), LIVE_CHUNK):
        diarizer.receive_audio(samples[start : start + LIVE_CHUNK])
        step(min(len(samples), start + LIVE_CHUNK))
    diarizer.receive_end_of_stream()
    offers = [(0, segment, turn) for _, segment, turn in offers]  # what is left is offered at the end
    step(len(samples))
    step(len(samples))
    words = tuple(w for t in turns for w in t.words)
    speakers = tuple(s for segment in range(len(turns)) for s in labelled[segment])
    return LiveRun(conversation, words, speakers, diarizer.tracker.speakers, tuple(holds))


@dataclass(frozen=True)
class LivePooled:
    attribution: float
    count_right: int
    files: int
    hold_p50_ms: float
    hold_p95_ms: float

    def line(self) -> str:
        return (
            f"word attribution {100 * self.attribution:.1f} %, speakers right in {self.count_right} of {self.files}, "
            f"finals held for labels p50 {self.hold_p50_ms:.0f} ms, p95 {self.hold_p95_ms:.0f} ms of stream time"
        )


def pool_live(runs: Sequence[LiveRun]) -> LivePooled:
    holds = np.array([h for r in runs for h in r.holds], dtype=np.float64) / SAMPLE_RATE * 1000
    right = sum(word_attribution(r.words, r.word_speakers) for r in runs)
    return LivePooled(
        attribution=right / max(1, sum(len(r.words) for r in runs)),
        count_right=sum(r.speakers == len(r.conversation.speakers) for r in runs),
        files=len(runs),
        hold_p50_ms=float(np.percentile(holds, 50)) if holds.size else 0.0,
        hold_p95_ms=float(np.percentile(holds, 95)) if holds.size else 0.0,
    )


@dataclass(frozen=True)
class Pooled:
    attribution: float
    count_right: int
    files: int
    der: float
    cpu_per_audio_second: float

    def line(self) -> str:
        return (
            f"word attribution {100 * self.attribution:.1f} %, speakers right in {self.count_right} of {self.files}, "
            f"DER {100 * self.der:.1f} %, encoder CPU {1000 * self.cpu_per_audio_second:.1f} ms per audio second"
        )


def pool(scores: Sequence[Score]) -> Pooled:
    der = DerScore(0, 0, 0, 0)
    for s in scores:
        der = der + s.der
    return Pooled(
        attribution=sum(s.words_right for s in scores) / max(1, sum(s.words for s in scores)),
        count_right=sum(s.found == s.speakers for s in scores),
        files=len(scores),
        der=der.der,
        cpu_per_audio_second=sum(s.cpu_seconds for s in scores) / max(1e-9, sum(s.seconds for s in scores)),
    )


# the sweep of --tune: windows (window_ms, step_ms), then the tracker's thresholds over each
WINDOWS = ((1600, 500), (1600, 750), (2000, 750))
DISTANCES = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45)
CONFIRMS = (1, 2, 3)


def tune(
    conversations: Sequence[Conversation], encoder: SpeakerEncoder, base: SpeakerOptions
) -> list[tuple[SpeakerOptions, Pooled]]:
    """Every option of the sweep on ``conversations``, best first (word attribution, then speaker count, then
    DER)."""
    results = []
    for window_ms, step_ms in WINDOWS:
        windowed = replace(base, window_ms=window_ms, step_ms=step_ms)
        embedded = [embed_conversation(c, encoder, windowed) for c in conversations]
        for distance, confirm in itertools.product(DISTANCES, CONFIRMS):
            options = replace(windowed, new_speaker_distance=distance, confirm_windows=confirm)
            results.append((options, pool([score(e, options) for e in embedded])))
    results.sort(key=lambda r: (-r[1].attribution, -r[1].count_right, r[1].der))
    return results


def _describe(options: SpeakerOptions) -> str:
    return (
        f"window {options.window_ms} ms every {options.step_ms} ms, distance {options.new_speaker_distance}, "
        f"confirm {options.confirm_windows}"
    )


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=6, help="conversations per half (default 6)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tune", action="store_true", help="sweep windows and thresholds on the tuning half first")
    parser.add_argument("--tune-count", type=int, default=12, help="conversations of the tuning half (default 12)")
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="also stream the report half and the real conversations through a server at real time, diarization "
        "off and on (minutes)",
    )
    parser.add_argument(
        "--deepgram",
        action="store_true",
        help="with --realtime: also through the Deepgram endpoint with the official deepgram-sdk",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --realtime: rounds of off and on, interleaved (default 1)"
    )
    parser.add_argument("--model", default="tiny.en", help="the model of the real-time run")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m streamer.bench.speakers",
        description="speaker labels measured on synthetic LibriSpeech conversations",
    )
    configure_parser(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    import torch

    if args.rounds < 1:
        raise ConfigError("--rounds must be >= 1")
    if (args.deepgram or args.rounds > 1) and not args.realtime:
        raise ConfigError("--deepgram and --rounds go with --realtime")

    from streamer.engine.speaker_encoder import load_speaker_encoder

    # one thread: the CPU figure is then the encoder's work, not OpenMP threads spinning on a shared machine
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    encoder = load_speaker_encoder()
    defaults = SpeakerOptions()
    if args.tune:
        tuning = build_conversations("tune", args.tune_count, args.seed)
        results = tune(tuning, encoder, defaults)
        print(f"tuning half, {len(tuning)} conversations, the best 10 of {len(results)}:")
        for options, pooled in results[:10]:
            print(f"  {_describe(options)}: {pooled.line()}")
        default = next(p for o, p in results if o == defaults)
        print(f"  defaults ({_describe(defaults)}): {default.line()}")
    report = build_conversations("report", args.count, args.seed)
    real = real_conversations()
    for title, conversations in (
        (f"report half, {len(report)} synthetic conversations", report),
        ("the shared real conversations, mixed to mono", real),
    ):
        embedded = [embed_conversation(c, encoder, defaults) for c in conversations]
        scores = [score(e, defaults) for e in embedded]
        print(f"{title}, offline pipeline, defaults ({_describe(defaults)}):")
        for s in scores:
            share = {k: 100 * getattr(s.der, k) / max(1, s.der.scored) for k in ("missed", "false_alarm", "confusion")}
            print(
                f"  {s.name}: {s.seconds:.0f} s, {s.speakers} speakers, found {s.found}, attribution "
                f"{100 * s.attribution:.1f} % of {s.words} words, DER {100 * s.der.der:.1f} % (missed "
                f"{share['missed']:.1f}, false alarm {share['false_alarm']:.1f}, confusion "
                f"{share['confusion']:.1f}; speech frames from the VAD), {s.windows} windows"
            )
        pooled = pool(scores)
        windows = sum(s.windows for s in scores)
        print(
            f"  pooled: {pooled.line()}; {1000 * sum(s.cpu_seconds for s in scores) / max(1, windows):.1f} ms a window"
        )
        live = pool_live([diarize_live(c, encoder, defaults) for c in conversations])
        print(
            f"  live (the server's diarizer, 100 ms chunks, each turn's final offered at its end point): {live.line()}"
        )
    if args.realtime:
        from streamer.bench.speakers_realtime import run_realtime

        torch.set_num_threads(threads)  # the server's engine gets the machine's threads back
        clients = ("listen", "deepgram") if args.deepgram else ("listen",)
        sets = [("report half (synthetic)", report), ("shared real conversations (mono)", real)]
        for line in run_realtime(sets, args.model, clients=clients, rounds=args.rounds):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
