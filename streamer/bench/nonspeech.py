"""``streamer bench nonspeech``: silence, noise, tones and music never become words (issue 16).

:func:`generate` makes non-speech audio at the levels a deployment meets it: white, pink and brown noise (room and
line noise, -60 to -30 dBFS), mains hum at 50 and 60 Hz with its odd harmonics, DTMF digits and ringback cadences
(US 440+480 Hz, 2 s on 4 s off; UK 400+450 Hz, 0.4-0.2-0.4 s on 2 s off), clicks over a quiet floor, comfort noise
at telephone levels (300-3400 Hz, -65 to -55 dBFS, through the mu-law codec), long silences (digital zero and
dither), and music and wordless singing (issue 39, :mod:`streamer.bench.music`: plucked strings, sustained organ,
strings and pads, hold music through a telephone line, singing on open vowels and humming). :func:`program` cycles
through the kinds, levels and seeds to any length.

The bench streams the shared ``nonspeech/`` set and ``--minutes`` of generated audio through ``/v1/listen`` on an
in-process server with the real model, as fast as the server takes it (no audio rate limit; the VAD and the core do
not depend on the pace, only the window lengths do), and counts the words of every partial and final: the answer
must be 0. Each piece is its own stream, so each is judged from a fresh start, as a call or a session would be.
The one shared recording that opens with speech (the guitar's spoken count-in, :data:`SPOKEN_OPENINGS`) is streamed
from where its music starts; ``tests/bench/test_nonspeech.py`` holds the count-in to its words.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamer.bench import music
from streamer.bench.harness import DATA, AudioArray, StreamRun, add_engine_arguments, make_engine, serve, stream_file
from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report
from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE

__all__ = [
    "HELD_OUT_SEED",
    "KINDS",
    "SPOKEN_OPENINGS",
    "NonSpeechClip",
    "SpokenOpening",
    "add_kinds_argument",
    "add_seed_argument",
    "configure_parser",
    "generate",
    "program",
    "run",
    "shared_nonspeech",
    "words_in",
]


def _db(level_dbfs: float) -> float:
    """Linear RMS of a level in dB relative to full scale (a full-scale sine is -3 dBFS RMS; we use RMS re 1.0)."""
    return float(10 ** (level_dbfs / 20))


def _scaled(x: np.ndarray, level_dbfs: float) -> AudioArray:
    rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) or 1.0
    return np.clip(x * (_db(level_dbfs) / rms), -1.0, 1.0).astype(np.float32)


def _coloured(n: int, rng: np.random.Generator, exponent: float) -> np.ndarray:
    """Noise whose power falls as 1/f**exponent (0 white, 1 pink, 2 brown), shaped in the frequency domain."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    f[0] = f[1]
    return np.fft.irfft(spectrum / f ** (exponent / 2), n)


def _tone(n: int, freqs: tuple[float, ...], phase: float = 0.0) -> np.ndarray:
    t = np.arange(n) / SAMPLE_RATE
    return sum((np.sin(2 * np.pi * f * t + phase) for f in freqs), np.zeros(n))


def _cadence(n: int, on_off: tuple[float, ...], tone: np.ndarray) -> np.ndarray:
    """``tone`` gated by a repeating on/off cadence (seconds: on, off, on, off, ...)."""
    gate = np.zeros(n)
    t = 0
    while t < n:
        for i, seconds in enumerate(on_off):
            length = int(seconds * SAMPLE_RATE)
            if i % 2 == 0:
                gate[t : t + length] = 1.0
            t += length
    return tone * gate


def _white(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    return _scaled(rng.standard_normal(n), level)


def _pink(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    return _scaled(_coloured(n, rng, 1.0), level)


def _brown(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    return _scaled(_coloured(n, rng, 2.0), level)


def _hum(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    mains = 50.0 if rng.random() < 0.5 else 60.0
    t = np.arange(n) / SAMPLE_RATE
    # odd harmonics, falling off, as a transformer's or a ground loop's buzz
    x = sum(np.sin(2 * np.pi * mains * k * t + rng.random() * 6.28) / k for k in (1, 3, 5, 7, 9))
    return _scaled(np.asarray(x) + 0.01 * rng.standard_normal(n), level)


_DTMF = {
    d: (lo, hi)
    for row, lo in zip(("123A", "456B", "789C", "*0#D"), (697, 770, 852, 941), strict=True)
    for d, hi in zip(row, (1209, 1336, 1477, 1633), strict=True)
}


def _dtmf(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """Digits of 70-150 ms with gaps of 70-500 ms (keypad dialling and IVR menu choices) over a quiet floor."""
    x = 1e-4 * rng.standard_normal(n)
    t = int(rng.uniform(0.2, 1.0) * SAMPLE_RATE)
    peak = _db(level) * np.sqrt(2)
    while t < n:
        length = int(rng.uniform(0.07, 0.15) * SAMPLE_RATE)
        digit = "0123456789*#"[int(rng.integers(12))]
        x[t : t + length] += peak / 2 * _tone(min(length, n - t), _DTMF[digit])
        t += length + int(rng.uniform(0.07, 0.5) * SAMPLE_RATE)
    return np.clip(x, -1, 1).astype(np.float32)


def _ringback(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    if rng.random() < 0.5:
        x = _cadence(n, (2.0, 4.0), _tone(n, (440.0, 480.0)))  # North America
    else:
        x = _cadence(n, (0.4, 0.2, 0.4, 2.0), _tone(n, (400.0, 450.0)))  # UK
    return np.clip(x * _db(level) + 1e-4 * rng.standard_normal(n), -1, 1).astype(np.float32)


def _clicks(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """Clicks and pops (a handset knocked, a relay, keyboard) 0.1 to 2 s apart over a -70 dBFS floor."""
    x = _db(-70) * rng.standard_normal(n)
    t = int(rng.uniform(0, 0.5) * SAMPLE_RATE)
    while t < n:
        length = int(rng.integers(16, 160))
        decay = np.exp(-np.arange(length) / (length / 4))
        x[t : t + length] += _db(level) * 4 * decay * rng.standard_normal(length)[: n - t][: len(decay)]
        t += length + int(rng.uniform(0.1, 2.0) * SAMPLE_RATE)
    return np.clip(x, -1, 1).astype(np.float32)


def _comfort(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """Comfort noise as a telephone line sends it: 300-3400 Hz, low level, through the mu-law codec and back."""
    from streamer.core.audio import decode_mulaw, encode_mulaw

    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    spectrum[(f < 300) | (f > 3400)] = 0
    return decode_mulaw(encode_mulaw(_scaled(np.fft.irfft(spectrum, n), level)))[:n]


def _silence(n: int, rng: np.random.Generator, level: float) -> AudioArray:
    """Digital zero, or the one-bit dither of a quiet 16-bit converter."""
    if level <= -120:
        return np.zeros(n, dtype=np.float32)
    return (rng.integers(-1, 2, n) / 32768).astype(np.float32)


Generator = Callable[[int, np.random.Generator, float], AudioArray]

# kind -> (generator, the levels (dBFS RMS) it is generated at)
KINDS: dict[str, tuple[Generator, tuple[float, ...]]] = {
    "white": (_white, (-60.0, -45.0, -30.0)),
    "pink": (_pink, (-60.0, -45.0, -30.0)),
    "brown": (_brown, (-55.0, -40.0, -30.0)),
    "hum": (_hum, (-50.0, -35.0, -25.0)),
    "dtmf": (_dtmf, (-20.0, -10.0)),
    "ringback": (_ringback, (-30.0, -19.0)),
    "clicks": (_clicks, (-40.0, -25.0)),
    "comfort": (_comfort, (-65.0, -55.0)),
    "silence": (_silence, (-150.0, -90.0)),
    # music in the room or on a speaker, and on a call's line (issue 39): quieter than speech, up to speech's level
    "plucked": (music.plucked, (-35.0, -25.0)),
    "sustained": (music.sustained, (-35.0, -25.0)),
    "hold": (music.hold_music, (-30.0, -20.0)),
    "singing": (music.singing, (-30.0, -20.0)),
    "humming": (music.humming, (-35.0, -25.0)),
}


@dataclass(frozen=True)
class NonSpeechClip:
    """A piece of non-speech audio: what it is, and its samples (float32 mono 16 kHz)."""

    name: str
    samples: AudioArray

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def generate(kind: str, seconds: float, level: float, seed: int = 0) -> NonSpeechClip:
    """``seconds`` of ``kind`` (a key of :data:`KINDS`) at ``level`` dBFS, reproducible from ``seed``."""
    if kind not in KINDS:
        raise ConfigError(f"unknown non-speech kind {kind!r}: use {', '.join(KINDS)}")
    samples = KINDS[kind][0](int(seconds * SAMPLE_RATE), np.random.default_rng(seed), level)
    return NonSpeechClip(f"{kind} {level:g} dBFS #{seed}", samples)


def program(
    total_seconds: float, piece_seconds: float = 60.0, kinds: Sequence[str] | None = None, first_seed: int = 0
) -> Iterator[NonSpeechClip]:
    """Pieces of every kind (or of ``kinds``, keys of :data:`KINDS`) at every level, round after round with new seeds
    from ``first_seed`` on, until ``total_seconds``."""
    chosen = list(KINDS) if kinds is None else list(kinds)
    if unknown := [kind for kind in chosen if kind not in KINDS]:
        raise ConfigError(f"unknown non-speech kind {unknown[0]!r}: use {', '.join(KINDS)}")
    combos = [(kind, level) for kind in chosen for level in KINDS[kind][1]]
    made = 0.0
    seed = first_seed
    while made < total_seconds:
        for kind, level in combos:
            if made >= total_seconds:
                return
            seconds = min(piece_seconds, total_seconds - made)
            yield generate(kind, seconds, level, seed)
            made += seconds
        seed += 1


@dataclass(frozen=True)
class SpokenOpening:
    """Speech at the start of a shared "non-speech" recording: its first ``seconds`` hold ``words`` (lower case, numbers
    spelled out: Whisper writes a count as digits or words)."""

    seconds: float
    words: str
    evidence: str


# The shared set's manifest calls every ``nonspeech/`` recording non-speech, but guitar_16k.wav opens with a spoken
# count-in: both tiny.en and base write "1, 2, 3, 4" there, and so does the spectrogram. From 0.6 to 2.9 s it holds
# four voiced syllables of a low male voice (harmonics of a 75 to 90 Hz fundamental that glides within and between
# them, and formants above 500 Hz that the guitar's notes lack), the burst of the "t" in "two" at 1.25 s and the
# fricatives of "three" (1.70 s, a quarter of its energy above 4 kHz) and "four" (2.15 s); the first chord comes at
# 3.1 s, as steady harmonic lines of 110 and 220 Hz with plucked onsets. Alone, 0 to 3.05 s is transcribed
# "1, 2, 3, 4." (each word's time inside the count-in) and 3.05 s to the end as nothing. The count-in is speech,
# and words for it are right: the music is what follows it.
SPOKEN_OPENINGS: dict[str, SpokenOpening] = {
    "guitar_16k.wav": SpokenOpening(
        3.05,
        "one two three four",
        "a spoken count-in: voiced syllables of a low voice with formants, a 't' burst and 'th' and 'f' fricatives",
    ),
}


def shared_nonspeech(data: Path = DATA) -> list[NonSpeechClip]:
    """The shared ``nonspeech/`` recordings (real noise, guitar, an empty recording, generated silence and noise),
    each without the speech that opens it (:data:`SPOKEN_OPENINGS`: the guitar's count-in)."""
    from streamer.offline.audiofile import load_audio

    folder = data / "nonspeech"
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".wav", ".flac")) if folder.is_dir() else []
    pieces = []
    for path in files:
        samples = load_audio(path).samples
        opening = SPOKEN_OPENINGS.get(path.name)
        if opening is None:
            pieces.append(NonSpeechClip(f"nonspeech/{path.name}", samples))
        else:
            cut = round(opening.seconds * SAMPLE_RATE)
            pieces.append(NonSpeechClip(f"nonspeech/{path.name} from {opening.seconds:g} s", samples[cut:]))
    return pieces


def words_in(run: StreamRun) -> list[str]:
    """Every word the client was shown, in partials and finals alike."""
    return [w for t in run.transcripts for w in t.text.split()]


# ---------------------------------------------------------------------------------------------------------------------
# The benchmark


def _kinds(text: str) -> list[str]:
    kinds = [kind.strip() for kind in text.split(",") if kind.strip()]
    if not kinds or any(kind not in KINDS for kind in kinds):
        raise argparse.ArgumentTypeError(f"kinds are a comma-separated list of {', '.join(KINDS)}")
    return kinds


def add_kinds_argument(parser: argparse.ArgumentParser) -> None:
    """``--kinds``: which generated kinds a bench makes (:func:`program`'s ``kinds``; default all)."""
    parser.add_argument(
        "--kinds",
        type=_kinds,
        default=None,
        help=f"generated kinds, comma-separated (default: all of {', '.join(KINDS)})",
    )


# the generated pieces' seeds start here unless --first-seed says otherwise; the non-speech rules (the tone and music
# detectors' thresholds) were tuned on pieces from seed 0, so a held-out run starts far above the seeds a tuning run
# reaches (a 60-minute run of every kind uses about 30)
HELD_OUT_SEED = 1000


def add_seed_argument(parser: argparse.ArgumentParser) -> None:
    """``--first-seed``: the seed of the first round of generated pieces (:func:`program`'s ``first_seed``)."""
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="seed of the first round of generated pieces (default 0, the tuning pieces; e.g. "
        f"{HELD_OUT_SEED} for pieces nobody tuned on)",
    )


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of generated non-speech (default: 10)")
    parser.add_argument("--piece-seconds", type=float, default=60.0, help="length of each generated piece")
    parser.add_argument("--no-shared", action="store_true", help="leave out the shared nonspeech/ recordings")
    add_kinds_argument(parser)
    add_seed_argument(parser)
    parser.add_argument("--concurrency", type=int, default=4, help="pieces streamed at once (default: 4)")
    add_engine_arguments(parser)
    add_docs_argument(parser)


async def _stream_all(engine: object, pieces: list[NonSpeechClip], args: argparse.Namespace) -> list[StreamRun]:
    from streamer.engine.types import Engine

    assert isinstance(engine, Engine)
    ns = argparse.Namespace(**{**vars(args), "step_ms": 1000, "endpoint_ms": 500})
    runs: list[StreamRun] = []
    async with serve(engine, ns, max_sessions=args.concurrency, flush_timeout=3600.0) as server:
        url = f"ws://127.0.0.1:{server.port}"
        for first in range(0, len(pieces), args.concurrency):
            batch = pieces[first : first + args.concurrency]
            for piece in batch:
                print(f"streaming {piece.name} ({piece.seconds:.0f} s)", file=sys.stderr)
            runs += await asyncio.gather(*(stream_file(url, p.name, p.samples, speed=0.0, chunk_ms=100) for p in batch))
    return runs


def _openings_note(no_shared: bool) -> list[str]:
    if no_shared or not SPOKEN_OPENINGS:
        return []
    cuts = "; ".join(f"{name} from {o.seconds:g} s ({o.evidence})" for name, o in SPOKEN_OPENINGS.items())
    return [f"Shared recordings streamed without the speech that opens them: {cuts}.", ""]


def run(args: argparse.Namespace) -> int:
    from streamer.bench.harness import FakeTimeline

    if args.minutes < 0 or args.piece_seconds <= 0 or args.concurrency < 1:
        raise ConfigError("--minutes must be >= 0, --piece-seconds > 0 and --concurrency >= 1")
    machine = machine_note()
    started = time.perf_counter()
    generated = program(args.minutes * 60, args.piece_seconds, args.kinds, args.first_seed)
    pieces = ([] if args.no_shared else shared_nonspeech()) + list(generated)
    engine = make_engine(args, FakeTimeline())
    try:
        runs = asyncio.run(_stream_all(engine, pieces, args))
    finally:
        engine.close()
    wall = time.perf_counter() - started
    by_kind: dict[str, list[tuple[NonSpeechClip, StreamRun]]] = {}
    for piece, result in zip(pieces, runs, strict=True):
        kind = "shared " + piece.name.split("/")[1] if piece.name.startswith("nonspeech/") else piece.name.split()[0]
        by_kind.setdefault(kind, []).append((piece, result))
    rows = []
    for kind, items in by_kind.items():
        words = [w for _, r in items for w in words_in(r)]
        errors = [e for _, r in items for e in r.errors]
        rows.append(
            [
                kind,
                str(len(items)),
                f"{sum(p.seconds for p, _ in items) / 60:.1f}",
                str(len(words)),
                " ".join(words[:12]) or "-",
                str(len(errors)),
            ]
        )
    total_words = sum(int(r[3]) for r in rows)
    audio = sum(p.seconds for p in pieces)
    body = "\n".join(
        [
            f"{len(pieces)} streams, {audio / 60:.1f} minutes of non-speech through /v1/listen ({args.model}), "
            f"{args.concurrency} at a time as fast as the server takes them; the run took {wall / 60:.1f} minutes.",
            "",
            format_table(["kind", "streams", "minutes", "words", "first words", "errors"], rows),
            "",
            *_openings_note(args.no_shared),
            f"Words shown to clients (partials and finals): **{total_words}** (target: 0).",
        ]
    )
    print(body)
    figures = {
        "machine": machine,
        "engine": engine.info,
        "audio_seconds": audio,
        "wall_seconds": wall,
        "words": total_words,
        "streams": [
            {"name": p.name, "seconds": p.seconds, "words": words_in(r), "errors": r.errors}
            for p, r in zip(pieces, runs, strict=True)
        ],
    }
    print(
        f"wrote {write_report(Report('nonspeech', command_line('nonspeech', args), body, figures), args.docs)}",
        file=sys.stderr,
    )
    return 0 if total_words == 0 else 1
