"""``streamer bench capacity``: how many concurrent real-time streams one server keeps within its latency budget.

For N in a ramp (1, 2, 4, 6, 8, ... up to ``--max-streams``), N clients stream the same long-form audio at once,
paced in real time, their starts staggered across one decode step so their windows do not all fall due together. They
stream from a process of their own (:mod:`streamer.bench.clients`), not from the server's: there they would share its
event loop and GIL with the engine, which no deployment's clients do (``--clients inline`` keeps that way).
A step holds when, over all N streams:

- the speaker-measured final delay p95 is within ``--limit-ms``: from the moment the client sent the audio of a
  final's last word to the final's arrival, on the client's clock (issue 16; the server's ``latency_ms``, its share
  of that delay, is shown beside it and judged nowhere), and
- the lag of finals does not grow: the median lag (arrival of a final minus the moment the end of its audio was
  sent) over the last third of the stream exceeds the median over the first third by at most ``--max-lag-growth``
  seconds; a server that falls behind shows it here before the p95 catches up, and
- no audio was lost (the server gives up on windows it could not decode before the session's flush timeout).

The ramp stops at the first N that fails; the largest N held is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from streamer.bench.accuracy import final_delays
from streamer.bench.clients import ClientShare, ClientStream, add_clients_argument, stream_clients
from streamer.bench.harness import (
    LIBRISPEECH_LONGFORM,
    AudioArray,
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
    tiled,
)
from streamer.bench.report import (
    Distribution,
    Report,
    add_docs_argument,
    command_line,
    format_table,
    machine_note,
    plot_curve,
    write_report,
)
from streamer.core.errors import ConfigError

__all__ = [
    "CapacityStep",
    "add_load_arguments",
    "check_load_arguments",
    "configure_parser",
    "failures_of",
    "judge",
    "lag_growth",
    "largest_held",
    "measure_step",
    "ramp",
    "run",
]


def ramp(max_streams: int) -> list[int]:
    """1, 2, then every even number up to ``max_streams`` (and ``max_streams`` itself)."""
    steps = [n for n in (1, 2) if n <= max_streams] + list(range(4, max_streams + 1, 2))
    if max_streams not in steps:
        steps.append(max_streams)
    return steps


@dataclass(frozen=True)
class CapacityStep:
    """The figures of N concurrent streams, and whether N held."""

    streams: int
    final_ms: Distribution  # speaker-measured: a final's arrival minus the sending of its last word's end
    partial_ms: Distribution  # the server's latency_ms
    lag_early_s: float | None  # median lag of finals in the first third of the audio
    lag_late_s: float | None  # ... in the last third
    engine_busy: float  # engine wall time over the step's wall time
    windows: int  # window decodes
    mean_batch: float  # windows per engine call
    decoder_passes: Distribution
    lost_seconds: float
    errors: tuple[str, ...]
    server_final_ms: Distribution = field(default_factory=lambda: Distribution.of([]))  # the server's latency_ms
    failures: tuple[str, ...] = field(default=())  # why it did not hold; empty when it held

    @property
    def lag_growth_s(self) -> float | None:
        if self.lag_early_s is None or self.lag_late_s is None:
            return None
        return self.lag_late_s - self.lag_early_s

    @property
    def held(self) -> bool:
        return not self.failures


def lag_growth(runs: list[StreamRun]) -> tuple[float | None, float | None]:
    """Median lag (seconds) of the finals ending in the first third of their stream, and in the last third."""
    early: list[float] = []
    late: list[float] = []
    for run in runs:
        for final in run.finals:
            if final.end <= run.audio_seconds / 3:
                early.append(run.lag(final))
            elif final.end >= 2 * run.audio_seconds / 3:
                late.append(run.lag(final))
    return (statistics.median(early) if early else None, statistics.median(late) if late else None)


def judge(step: CapacityStep, limit_ms: float, max_lag_growth: float) -> CapacityStep:
    """``step`` with its failures filled in against the limits."""
    failures = failures_of(step.final_ms, step.lag_growth_s, step.lost_seconds, step.errors, limit_ms, max_lag_growth)
    return replace(step, failures=failures)


def failures_of(
    final_ms: Distribution,
    lag_growth_s: float | None,
    lost_seconds: float,
    errors: tuple[str, ...],
    limit_ms: float,
    max_lag_growth: float,
) -> tuple[str, ...]:
    """Why a step of N streams did not hold (empty when it held): the rules of this module's docstring, shared with
    ``streamer bench load``."""
    failures = []
    if final_ms.p95 is None:
        failures.append("no finals")
    elif final_ms.p95 > limit_ms:
        failures.append(f"final p95 {final_ms.p95:.0f} ms > {limit_ms:.0f} ms")
    if lag_growth_s is not None and lag_growth_s > max_lag_growth:
        failures.append(f"lag grew {lag_growth_s:.2f} s > {max_lag_growth:g} s")
    if lost_seconds > 0:
        failures.append(f"{lost_seconds:.1f} s of audio lost")
    if errors:
        failures.append(f"{len(errors)} error message(s)")
    return tuple(failures)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-streams", type=int, default=16, help="the last step of the ramp (default: 16)")
    add_load_arguments(parser)


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a step of N streams (:func:`measure_step`) and of its verdict (:func:`judge`)."""
    parser.add_argument("--file", type=Path, default=LIBRISPEECH_LONGFORM, help="audio every stream sends")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of audio per stream (default: 60)")
    parser.add_argument(
        "--limit-ms", type=float, default=2000.0, help="speaker-measured final delay p95 limit (default: 2000)"
    )
    parser.add_argument(
        "--max-lag-growth", type=float, default=1.0, help="seconds the final lag may grow, early to late (default: 1)"
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=None, help="windows per engine call (default: the server's default)"
    )
    parser.add_argument(
        "--diarize",
        action="store_true",
        help="every stream asks for speaker labels (diarize=true); section capacity-diarize",
    )
    add_clients_argument(parser)
    add_engine_arguments(parser)
    add_stream_arguments(parser)
    add_docs_argument(parser)


def largest_held(steps: list[CapacityStep]) -> int:
    """The largest N held (0 when even one stream failed); the ramp stops at the first failure."""
    return max((step.streams for step in steps if step.held), default=0)


async def measure_step(
    engine: RecordingEngine, file_samples: AudioArray, n: int, args: argparse.Namespace
) -> CapacityStep:
    """N streams of the file at once against an in-process server on ``engine``, sent from a client process of their
    own (``--clients process``, as a deployment's clients are; ``inline``: from this process, sharing the server's
    event loop and GIL); the figures of that step. A stream that fails (a refused or dropped connection) is one of
    the step's errors."""
    samples = tiled(file_samples, args.duration)
    stagger = args.step_ms / 1000 / n / args.speed
    streams = tuple(ClientStream(f"stream {i}", samples, i * stagger) for i in range(n))
    async with serve(engine, args, max_sessions=n) as server:
        share = ClientShare(
            f"ws://127.0.0.1:{server.port}", streams, args.speed, args.chunk_ms, getattr(args, "diarize", False)
        )
        engine.take()
        result = await stream_clients(share, args.clients)
        records: list[DecodeRecord] = engine.take()
    runs = list(result.runs)
    wall = result.wall_seconds
    early, late = lag_growth(runs)
    calls = sum(1 / r.batch_size for r in records)
    return CapacityStep(
        streams=n,
        final_ms=Distribution.of(1000 * d for r in runs for d in final_delays(r)),
        partial_ms=Distribution.of(t.latency_ms for r in runs for t in r.partials),
        server_final_ms=Distribution.of(t.latency_ms for r in runs for t in r.finals if t.words),  # the same finals
        lag_early_s=early,
        lag_late_s=late,
        engine_busy=sum(r.batch_seconds / r.batch_size for r in records) / wall if wall else 0.0,
        windows=len(records),
        mean_batch=len(records) / calls if calls else 0.0,
        decoder_passes=Distribution.of(r.decoder_passes for r in records),
        lost_seconds=sum(r.done.lost_seconds for r in runs if r.done is not None),
        errors=tuple(e for r in runs for e in r.errors) + tuple(f"stream failed: {f}" for f in result.failed),
    )


def format_steps(steps: list[CapacityStep], args: argparse.Namespace) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:+.2f}" if value != 0 else "0.00"

    rows = [
        [
            str(step.streams),
            ms(step.final_ms.p50),
            ms(step.final_ms.p95),
            ms(step.server_final_ms.p95),
            ms(step.partial_ms.p50),
            "-" if step.lag_early_s is None else f"{step.lag_early_s:.2f}",
            s(step.lag_growth_s),
            f"{100 * step.engine_busy:.0f}%",
            f"{step.mean_batch:.1f}",
            "-" if step.decoder_passes.mean is None else f"{step.decoder_passes.mean:.1f}",
            f"{step.lost_seconds:.1f}",
            "held" if step.held else "FAILED: " + "; ".join(step.failures),
        ]
        for step in steps
    ]
    header = [
        "streams",
        "final p50 ms",
        "final p95 ms",
        "server final p95 ms",
        "server partial p50 ms",
        "lag early s",
        "lag growth s",
        "engine busy",
        "batch",
        "passes/window",
        "lost s",
        "verdict",
    ]
    ended = steps[-1].held
    return "\n".join(
        [
            f"{args.duration:g} s of audio per stream at {args.speed:g}x real time, starts staggered over one step "
            f"({args.step_ms} ms); limits: final p95 <= {args.limit_ms:.0f} ms, lag growth <= "
            f"{args.max_lag_growth:g} s, no audio lost. The final delay is the speaker's: from the sending of the "
            "audio of a final's last word to the final's arrival, on the client's clock; the server's share of it "
            "(`latency_ms`) is shown beside it.",
            "",
            format_table(header, rows),
            "",
            f"Largest number of concurrent real-time streams held: {largest_held(steps)}"
            + (f" (the ramp ended at --max-streams {args.max_streams}; the limit is higher)" if ended else ""),
        ]
    )


def check_load_arguments(args: argparse.Namespace) -> None:
    """Raise :class:`~streamer.core.errors.ConfigError` for the first bad option of :func:`add_load_arguments`."""
    check_stream_arguments(args)
    if args.duration <= 0:
        raise ConfigError("--duration must be > 0")
    if args.max_batch_size is not None and args.max_batch_size < 1:
        raise ConfigError("--max-batch-size must be at least 1")
    if not args.file.exists():
        raise ConfigError(f"{args.file}: no such file")


def run(args: argparse.Namespace) -> int:
    if args.max_streams < 1:
        raise ConfigError("--max-streams must be at least 1")
    check_load_arguments(args)
    machine = machine_note()
    file = load_bench_file(args.file)
    timeline = FakeTimeline(FakeTimeline.words_for(file))
    engine = make_engine(args, timeline)
    steps: list[CapacityStep] = []
    try:
        for n in ramp(args.max_streams):
            print(f"{n} concurrent stream(s) of {args.duration:g} s ...", file=sys.stderr)
            step = judge(asyncio.run(measure_step(engine, file.samples, n, args)), args.limit_ms, args.max_lag_growth)
            steps.append(step)
            print(f"  final p95 {step.final_ms.p95} ms, {'held' if step.held else step.failures}", file=sys.stderr)
            if not step.held:
                break
    finally:
        engine.close()
    body = format_steps(steps, args)
    print(body)
    plot = "capacity-diarize.png" if getattr(args, "diarize", False) else "capacity.png"
    drawn = plot_curve(
        args.docs / "benchmarks" / plot,
        f"capacity, {args.model if args.engine == 'real' else 'scripted engine'}, {args.duration:g} s streams",
        [s.streams for s in steps],
        {
            "final p95": [s.final_ms.p95 for s in steps],
            "final p50": [s.final_ms.p50 for s in steps],
            "partial p50": [s.partial_ms.p50 for s in steps],
        },
        args.limit_ms,
    )
    figures = {
        "machine": machine,
        "engine": engine.info,
        "file": str(args.file),
        "largest_held": largest_held(steps),
        "steps": [{**s.__dict__, "lag_growth_s": s.lag_growth_s, "held": s.held} for s in steps],
    }
    section = "capacity-diarize" if getattr(args, "diarize", False) else "capacity"
    report = Report(section, command_line("capacity", args), body, figures, (plot,) if drawn else ())
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
