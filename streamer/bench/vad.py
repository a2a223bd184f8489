"""``streamer bench vad``: the voice activity detectors side by side: speech recall, non-speech rejection, CPU.

Each contender (a :class:`~streamer.core.vad.VadOptions`: the two backends, and webrtc without its energy gate)
labels the same audio, piece by piece, interleaved, each piece its own stream (a fresh detector, as a call or a
session starts), fed in ``--chunk-ms`` chunks as a client sends them:

- speech recall: the fraction of reference speech time labelled speech. The references are the LibriSpeech
  utterances of the shared data, each counted as speech wall to wall (they hold a few hundred milliseconds of lead-in
  and trailing silence, so a perfect detector scores a little under 1, the same for every contender), and each
  channel of the conversation recording against its TextGrid's intervals (one talker a channel).
- non-speech rejection: the fraction of non-speech time labelled non-speech: the shared ``nonspeech/`` recordings
  (real noise, an empty room, dishes, guitar; generated silence and noise) and ``--minutes`` of the generated
  non-speech of :mod:`streamer.bench.nonspeech` (noise, mains hum, DTMF, ringback, clicks, comfort noise, silence,
  music and wordless singing; ``--kinds`` picks some).
- CPU: process time per stream-hour, of the frame classifier alone (``time.process_time`` around each call) and of
  the whole detector (classifier, energy gate, tone and music detectors, hysteresis). Silero's model is loaded once
  per process beforehand, as the server does, and its load time is printed apart.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from streamer.bench.harness import DATA, AudioArray
from streamer.bench.nonspeech import add_kinds_argument, add_seed_argument
from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report
from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE
from streamer.core.vad import (
    FrameClassifier,
    VadBackend,
    VadOptions,
    VadSpan,
    VoiceActivityDetector,
    make_classifier,
)
from streamer.engine.silero_vad import CLASSIFIERS

__all__ = [
    "CONTENDERS",
    "Piece",
    "Tally",
    "TimedClassifier",
    "configure_parser",
    "label",
    "run",
    "speech_pieces",
]

# name -> options: the two backends as `--vad` runs them, webrtc without the energy gate that makes up for its
# false alarms on stationary noise (Silero runs without it; see streamer.core.vad), webrtc without the tone
# detector that makes up for its false alarms on DTMF and call-progress tones (streamer.core.tonal, issue 16), and
# each backend without the music detector that makes up for both taking music and singing for speech
# (streamer.core.music, issue 39)
CONTENDERS: dict[str, VadOptions] = {
    "webrtc": VadOptions(),
    "webrtc, no energy gate": VadOptions(energy_gate_db=None),
    "webrtc, no tone detector": VadOptions(reject_tones=False),
    "webrtc, no music detector": VadOptions(reject_music=False),
    "silero": VadOptions(backend=VadBackend.SILERO),
    "silero, no music detector": VadOptions(backend=VadBackend.SILERO, reject_music=False),
}


@dataclass(frozen=True)
class Piece:
    """One stream of the bench: its audio and where the reference says speech is (all of it, or none)."""

    name: str
    group: str  # librispeech, conversation, nonspeech/ (shared recordings) or generated
    samples: AudioArray
    speech: npt.NDArray[np.bool_]  # per sample: the reference's speech

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


class TimedClassifier:
    """A frame classifier that adds up the process time spent in it (a :class:`FrameClassifier` itself)."""

    def __init__(self, inner: FrameClassifier) -> None:
        self.inner = inner
        self.seconds = 0.0

    @property
    def frame_samples(self) -> int:
        return self.inner.frame_samples

    def classify(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        started = time.process_time()
        voiced = self.inner.classify(frames)
        self.seconds += time.process_time() - started
        return voiced


@dataclass
class Tally:
    """One contender's sums over one group of pieces."""

    reference_speech: int = 0  # samples the reference calls speech
    found_speech: int = 0  # ... of them labelled speech
    reference_nonspeech: int = 0
    rejected_nonspeech: int = 0  # non-speech samples labelled non-speech
    samples: int = 0
    classifier_seconds: float = 0.0  # process time
    detector_seconds: float = 0.0
    worst: dict[str, float] = field(default_factory=dict)  # piece name -> fraction of its non-speech taken for speech

    def add(self, piece: Piece, labelled: npt.NDArray[np.bool_], classifier: float, detector: float) -> None:
        speech = piece.speech
        self.reference_speech += int(speech.sum())
        self.found_speech += int((labelled & speech).sum())
        self.reference_nonspeech += int((~speech).sum())
        self.rejected_nonspeech += int((~labelled & ~speech).sum())
        self.samples += len(speech)
        self.classifier_seconds += classifier
        self.detector_seconds += detector
        if not speech.any():
            self.worst[piece.name] = float(labelled.mean())

    @classmethod
    def merged(cls, tallies: Iterable[Tally]) -> Tally:
        out = cls()
        for t in tallies:
            out.reference_speech += t.reference_speech
            out.found_speech += t.found_speech
            out.reference_nonspeech += t.reference_nonspeech
            out.rejected_nonspeech += t.rejected_nonspeech
            out.samples += t.samples
            out.classifier_seconds += t.classifier_seconds
            out.detector_seconds += t.detector_seconds
            out.worst |= t.worst
        return out

    @property
    def recall(self) -> float | None:
        return self.found_speech / self.reference_speech if self.reference_speech else None

    @property
    def rejection(self) -> float | None:
        return self.rejected_nonspeech / self.reference_nonspeech if self.reference_nonspeech else None

    def per_stream_hour(self, seconds: float) -> float:
        """CPU seconds per hour of one stream's audio."""
        return seconds / (self.samples / SAMPLE_RATE) * 3600 if self.samples else 0.0


def label(piece: Piece, options: VadOptions, chunk: int) -> tuple[npt.NDArray[np.bool_], float, float]:
    """``piece`` through a fresh detector in ``chunk``-sample chunks: the speech label of every sample, and the
    process time of the classifier and of the whole detector."""
    classifier = TimedClassifier(make_classifier(options, CLASSIFIERS))
    detector = VoiceActivityDetector(options, classifier)
    labelled = np.zeros(len(piece.samples), dtype=np.bool_)
    x = piece.samples
    spent = 0.0
    for first in range(0, len(x) + 1, chunk):
        started = time.process_time()
        events = detector.process(x[first : first + chunk]) if first < len(x) else detector.flush()
        spent += time.process_time() - started
        for event in events:
            if isinstance(event, VadSpan) and event.speech:
                labelled[event.start : event.end] = True
    return labelled, classifier.seconds, spent


def _mask(n: int, spans: Iterator[tuple[int, int]]) -> npt.NDArray[np.bool_]:
    mask = np.zeros(n, dtype=np.bool_)
    for start, end in spans:
        mask[start:end] = True
    return mask


def speech_pieces(data: Path) -> list[Piece]:
    """The LibriSpeech utterances (speech throughout) and the conversation channels with TextGrid intervals."""
    from streamer.bench.evalset import build_set
    from streamer.offline.audiofile import load_audio

    pieces = []
    for path in sorted((data / "librispeech").glob("test-*/*/*/*.flac")):
        samples = load_audio(path).samples
        pieces.append(Piece(f"librispeech/{path.name}", "librispeech", samples, np.ones(len(samples), np.bool_)))
    conversation = build_set(["conversation"], data) if (data / "conversation").is_dir() else []
    for stream in conversation:
        if stream.utterances:  # the channels whose talk is timed
            speech = _mask(len(stream.samples), ((u.start, u.end) for u in stream.utterances))
            pieces.append(Piece(stream.name, "conversation", stream.samples, speech))
    return pieces


def _nonspeech_pieces(data: Path, minutes: float, kinds: list[str] | None = None, first_seed: int = 0) -> list[Piece]:
    from streamer.bench.nonspeech import program, shared_nonspeech

    shared = [("nonspeech/", p) for p in shared_nonspeech(data)]
    generated = [("generated", p) for p in program(minutes * 60, 30.0, kinds, first_seed)]
    return [Piece(p.name, group, p.samples, np.zeros(len(p.samples), np.bool_)) for group, p in shared + generated]


# ---------------------------------------------------------------------------------------------------------------------
# The benchmark


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=DATA, help="the shared data folder (default: ../shared/data)")
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of generated non-speech (default: 10)")
    add_kinds_argument(parser)
    add_seed_argument(parser)
    parser.add_argument(
        "--chunk-ms", type=int, default=20, help="audio per call, as a client sends it (default: 20, telephony's)"
    )
    add_docs_argument(parser)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def run(args: argparse.Namespace) -> int:
    if not 10 <= args.chunk_ms <= 1000:
        raise ConfigError("--chunk-ms must be between 10 and 1000")
    machine = machine_note()
    started = time.perf_counter()
    load_started = time.process_time()
    from streamer.engine.silero_vad import load_model

    load_model()  # once per process, as the server does at start-up: not a stream's cost
    load_seconds = time.process_time() - load_started
    pieces = speech_pieces(args.data) + _nonspeech_pieces(args.data, args.minutes, args.kinds, args.first_seed)
    speech_groups = ("librispeech", "conversation")
    nonspeech_groups = ("nonspeech/", "generated")
    tallies = {name: {group: Tally() for group in (*speech_groups, *nonspeech_groups)} for name in CONTENDERS}
    chunk = args.chunk_ms * SAMPLE_RATE // 1000
    for index, piece in enumerate(pieces):
        for name, options in CONTENDERS.items():  # interleaved: the machine's load falls on every contender alike
            labelled, classifier, detector = label(piece, options, chunk)
            tallies[name][piece.group].add(piece, labelled, classifier, detector)
        print(f"\r{index + 1}/{len(pieces)} pieces", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    seconds = {g: sum(p.seconds for p in pieces if p.group == g) for g in (*speech_groups, *nonspeech_groups)}
    header = [
        "detector",
        f"recall LibriSpeech ({seconds['librispeech'] / 60:.1f} min)",
        f"recall conversation ({seconds['conversation']:.0f} s)",
        f"rejection nonspeech/ ({seconds['nonspeech/'] / 60:.1f} min)",
        f"rejection generated ({seconds['generated'] / 60:.0f} min)",
        "classifier CPU s/stream-h",
        "detector CPU s/stream-h",
    ]
    every = {name: Tally.merged(by_group.values()) for name, by_group in tallies.items()}
    speech = {name: Tally.merged(by_group[g] for g in speech_groups) for name, by_group in tallies.items()}
    nonspeech = {name: Tally.merged(by_group[g] for g in nonspeech_groups) for name, by_group in tallies.items()}
    rows = []
    figures_contenders = {}
    for name, options in CONTENDERS.items():
        cpu = every[name]
        rows.append(
            [
                name,
                _percent(tallies[name]["librispeech"].recall),
                _percent(tallies[name]["conversation"].recall),
                _percent(tallies[name]["nonspeech/"].rejection),
                _percent(tallies[name]["generated"].rejection),
                f"{cpu.per_stream_hour(cpu.classifier_seconds):.1f}",
                f"{cpu.per_stream_hour(cpu.detector_seconds):.1f}",
            ]
        )
        figures_contenders[name] = {
            "options": options,
            "speech_recall": speech[name].recall,
            "nonspeech_rejection": nonspeech[name].rejection,
            "groups": {
                g: {"recall": t.recall, "rejection": t.rejection, "seconds": t.samples / SAMPLE_RATE}
                for g, t in tallies[name].items()
            },
            "classifier_cpu_seconds_per_stream_hour": cpu.per_stream_hour(cpu.classifier_seconds),
            "detector_cpu_seconds_per_stream_hour": cpu.per_stream_hour(cpu.detector_seconds),
            "nonspeech_taken_for_speech": {k: v for k, v in nonspeech[name].worst.items() if v > 0},
        }
    # the non-speech pieces any contender takes partly for speech, worst first
    worst = {k: max(nonspeech[n].worst[k] for n in CONTENDERS) for k in nonspeech["webrtc"].worst}
    names = sorted((k for k, v in worst.items() if v > 0), key=lambda k: -worst[k])
    worst_rows = [[k, *(_percent(nonspeech[n].worst[k]) for n in CONTENDERS)] for k in names[:12]]
    body = "\n".join(
        [
            f"The same audio through each detector, one stream per piece ({len(pieces)} pieces, "
            f"{sum(seconds.values()) / 60:.1f} min), fed in {args.chunk_ms} ms chunks. Recall: the fraction of "
            "reference speech time labelled speech (LibriSpeech utterances count as speech wall to wall, lead-in "
            "silence included, so no detector reaches 100 %; the conversation's two channels against their "
            "TextGrid intervals). Rejection: the fraction of non-speech time labelled non-speech. CPU: process time "
            "per hour of one stream's audio, of the frame classifier alone and of the whole detector (classifier, "
            "energy gate, tone and music detectors, hysteresis). Silero's model loads once per process: "
            f"{1000 * load_seconds:.0f} ms of CPU here.",
            "",
            format_table(header, rows),
            "",
            "Non-speech taken partly for speech (fraction of the piece labelled speech):",
            "",
            format_table(["piece", *CONTENDERS], worst_rows) if worst_rows else "none",
            "",
            f"Total run time {time.perf_counter() - started:.0f} s.",
        ]
    )
    print(f"vad benchmark:\n{body}")
    figures = {
        "machine": machine,
        "chunk_ms": args.chunk_ms,
        "seconds": seconds,
        "silero_load_cpu_seconds": load_seconds,
        "contenders": figures_contenders,
    }
    report = Report("vad", command_line("vad", args), body, figures)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
