"""``streamer bench stream``: one real-time stream against offline transcription of the same audio, same engine.

Each file is streamed through an in-process server with the protocol v1 client, paced in real time; then the same
files are transcribed offline (:func:`streamer.offline.transcribe.transcribe`) on the same engine. Printed side by side:
streamed and offline WER (both normalised, pooled over the files) and their difference; the latency distributions
of partials and finals (the server's ``latency_ms``: from the arrival of the last audio a text needed to sending
it); time to first partial; decoder passes, encoder and decoder time per window decode (one decode per update).
The targets of the real-time issue are checked and the miss, if any, is printed as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from streamer.bench.harness import (
    ENGLISH_LONGFORM,
    LIBRISPEECH_LONGFORM,
    BenchFile,
    DecodeRecord,
    FakeTimeline,
    RecordingEngine,
    StreamRun,
    add_engine_arguments,
    add_stream_arguments,
    check_stream_arguments,
    load_bench_file,
    make_engine,
    serve,
    stream_file,
)
from streamer.bench.report import (
    Distribution,
    Report,
    add_docs_argument,
    command_line,
    format_table,
    machine_note,
    plot_cdfs,
    write_report,
)
from streamer.core.errors import ConfigError

__all__ = ["TARGETS", "StreamFigures", "StreamTargets", "configure_parser", "run", "summarize"]


@dataclass(frozen=True)
class StreamTargets:
    """The done-when of the real-time issue."""

    # streamed WER at most this many points above offline WER
    wer_gap_points: float = 1.5
    partial_p50_ms: float = 1000.0
    final_p95_ms: float = 2000.0


TARGETS = StreamTargets()


@dataclass(frozen=True)
class StreamFigures:
    """What one run of the benchmark measured."""

    files: tuple[str, ...]
    audio_seconds: float
    streamed_wer: float | None  # percent, pooled over files with a reference
    offline_wer: float | None
    partial_ms: Distribution
    final_ms: Distribution
    first_partial_s: Distribution  # one value per file
    decoder_passes: Distribution  # per window decode during streaming
    encoder_ms: Distribution  # per window decode (features + encoder)
    decoder_ms: Distribution
    window_s: Distribution  # seconds of audio per window decoded
    engine_busy: float  # engine wall time over stream wall time during streaming
    offline_rtf: float  # offline engine wall time over audio duration
    lost_seconds: float
    errors: tuple[str, ...]

    @property
    def wer_gap(self) -> float | None:
        if self.streamed_wer is None or self.offline_wer is None:
            return None
        return self.streamed_wer - self.offline_wer

    def verdicts(self, targets: StreamTargets = TARGETS) -> list[tuple[str, bool | None, str]]:
        """(target, met, what was measured) for each target; met is None when nothing was measured."""

        def check(value: float | None, limit: float) -> bool | None:
            return None if value is None else value <= limit

        gap = self.wer_gap
        return [
            (
                f"streamed WER within {targets.wer_gap_points:g} points of offline",
                check(gap, targets.wer_gap_points),
                "no reference" if gap is None else f"{gap:+.2f} points",
            ),
            (
                f"partial latency p50 <= {targets.partial_p50_ms:.0f} ms",
                check(self.partial_ms.p50, targets.partial_p50_ms),
                _ms(self.partial_ms.p50),
            ),
            (
                f"final latency p95 <= {targets.final_p95_ms:.0f} ms",
                check(self.final_ms.p95, targets.final_p95_ms),
                _ms(self.final_ms.p95),
            ),
        ]


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f} ms"


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--file", action="append", type=Path, help="audio file to stream, repeatable (default: LibriSpeech long-form)"
    )
    parser.add_argument("--all", action="store_true", help="every English long-form file of the shared data")
    add_engine_arguments(parser)
    add_stream_arguments(parser)
    add_docs_argument(parser)


def summarize(
    runs: list[StreamRun],
    records: list[DecodeRecord],
    files: list[BenchFile],
    offline_texts: list[str],
    offline_seconds: float,
) -> StreamFigures:
    """The figures of a run: ``runs`` and ``offline_texts`` in the order of ``files``."""
    from streamer.offline.normalize import normalize_english, word_error_rate

    scored = [i for i, f in enumerate(files) if f.reference is not None]
    refs = [normalize_english(files[i].reference or "") for i in scored]

    def wer(texts: list[str]) -> float | None:
        return word_error_rate(refs, [normalize_english(texts[i]) for i in scored]).wer * 100 if scored else None

    audio = sum(f.seconds for f in files)
    stream_wall = sum(r.wall_seconds for r in runs)
    lost = sum(r.done.lost_seconds for r in runs if r.done is not None)
    first = [r.first_partial_seconds for r in runs]
    return StreamFigures(
        files=tuple(f.name for f in files),
        audio_seconds=audio,
        streamed_wer=wer([r.text for r in runs]),
        offline_wer=wer(offline_texts),
        partial_ms=Distribution.of(t.latency_ms for r in runs for t in r.partials),
        final_ms=Distribution.of(t.latency_ms for r in runs for t in r.finals),
        first_partial_s=Distribution.of(s for s in first if s is not None),
        decoder_passes=Distribution.of(r.decoder_passes for r in records),
        encoder_ms=Distribution.of(1000 * r.encoder_seconds for r in records),
        decoder_ms=Distribution.of(1000 * r.decoder_seconds for r in records),
        window_s=Distribution.of(r.audio_seconds for r in records),
        engine_busy=_busy_seconds(records) / stream_wall if stream_wall else 0.0,
        offline_rtf=offline_seconds / audio if audio else 0.0,
        lost_seconds=lost,
        errors=tuple(e for r in runs for e in r.errors),
    )


def _busy_seconds(records: list[DecodeRecord]) -> float:
    # every window of a batch carries the batch's wall time: count each call once
    return sum(r.batch_seconds / r.batch_size for r in records)


def format_figures(figures: StreamFigures) -> str:
    """The Markdown body: the WER and latency table, the targets, the engine's work per update."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    f = figures
    gap = f.wer_gap
    lines = [
        f"{len(f.files)} file(s), {f.audio_seconds:.1f} s of audio: {', '.join(f.files)}",
        "",
        format_table(
            ["", "streamed", "offline", "difference"],
            [["WER %", pct(f.streamed_wer), pct(f.offline_wer), "-" if gap is None else f"{gap:+.2f}"]],
        ),
        "",
        format_table(
            ["latency", "n", "p50", "p95", "max"],
            [
                [name, str(d.count), *(_ms(v) for v in (d.p50, d.p95, d.max))]
                for name, d in (("partial", f.partial_ms), ("final", f.final_ms))
            ]
            + [
                [
                    "first partial",
                    str(f.first_partial_s.count),
                    *(_ms(None if v is None else 1000 * v) for v in (d.p50, d.p95, d.max)),
                ]
                for d in (f.first_partial_s,)
            ],
        ),
        "",
        format_table(
            ["per window decode", "mean", "p50", "p95", "max"],
            [
                [name, *("-" if v is None else f"{v:.{digits}f}" for v in (d.mean, d.p50, d.p95, d.max))]
                for name, d, digits in (
                    ("decoder passes", f.decoder_passes, 1),
                    ("encoder ms (with features)", f.encoder_ms, 0),
                    ("decoder ms", f.decoder_ms, 0),
                    ("window audio s", f.window_s, 1),
                )
            ],
        ),
        "",
        f"{f.decoder_passes.count} window decodes; engine busy {100 * f.engine_busy:.0f}% of the streaming wall time; "
        f"offline real-time factor {f.offline_rtf:.3f}; lost audio {f.lost_seconds:.2f} s.",
        "",
        "StreamTargets (real-time issue):",
        "",
    ]
    for target, met, measured in f.verdicts():
        verdict = "not measured" if met is None else ("met" if met else "MISSED")
        lines.append(f"- {target}: {measured}, {verdict}")
    if f.errors:
        lines += ["", "Errors from the server:", "", *(f"- {e}" for e in f.errors)]
    return "\n".join(lines)


async def _stream_all(
    engine: RecordingEngine, files: list[BenchFile], timeline: FakeTimeline, args: argparse.Namespace
) -> tuple[list[StreamRun], list[DecodeRecord]]:
    runs: list[StreamRun] = []
    records: list[DecodeRecord] = []
    async with serve(engine, args) as server:
        url = f"ws://127.0.0.1:{server.port}"
        for file in files:
            timeline.words = FakeTimeline.words_for(file)
            print(f"streaming {file.name} ({file.seconds:.0f} s at {args.speed:g}x real time)", file=sys.stderr)
            engine.take()
            runs.append(await stream_file(url, file.name, file.samples, speed=args.speed, chunk_ms=args.chunk_ms))
            records += engine.take()
    return runs, records


def run(args: argparse.Namespace) -> int:
    from streamer.offline.transcribe import transcribe

    check_stream_arguments(args)
    paths = list(args.file or (ENGLISH_LONGFORM if args.all else (LIBRISPEECH_LONGFORM,)))
    for path in paths:
        if not path.exists():
            raise ConfigError(f"{path}: no such file")
    machine = machine_note()
    files = [load_bench_file(p) for p in paths]
    timeline = FakeTimeline()
    engine = make_engine(args, timeline)
    try:
        # 1. Stream every file in real time through the server.
        runs, records = asyncio.run(_stream_all(engine, files, timeline, args))
        # 2. Transcribe the same files offline on the same engine.
        offline_texts = []
        offline_seconds = 0.0
        for file in files:
            timeline.words = FakeTimeline.words_for(file)
            print(f"transcribing {file.name} offline", file=sys.stderr)
            started = time.perf_counter()
            offline_texts.append(transcribe(engine, file.samples).text)
            offline_seconds += time.perf_counter() - started
    finally:
        engine.close()
    # 3. Report.
    figures = summarize(runs, records, files, offline_texts, offline_seconds)
    body = format_figures(figures)
    print(body)
    docs: Path = args.docs
    plot = "stream-latency.png"
    drawn = plot_cdfs(
        docs / "benchmarks" / plot,
        f"streaming latency, {args.model if args.engine == 'real' else 'scripted engine'}, one stream",
        {
            "partial": [t.latency_ms for r in runs for t in r.partials],
            "final": [t.latency_ms for r in runs for t in r.finals],
        },
        TARGETS.final_p95_ms,
    )
    json_figures = {
        "machine": machine,
        "engine": engine.info,
        "targets": TARGETS,
        "figures": figures,
        "wer_gap": figures.wer_gap,
        "verdicts": [{"target": t, "met": m, "measured": v} for t, m, v in figures.verdicts()],
        "streams": [{"file": r.file, "text": r.text, "done": r.done, "errors": r.errors} for r in runs],
        "offline": [{"file": f.name, "text": t} for f, t in zip(files, offline_texts, strict=True)],
    }
    report = Report("stream", command_line("stream", args), body, json_figures, (plot,) if drawn else ())
    print(f"wrote {write_report(report, docs)}", file=sys.stderr)
    return 0
