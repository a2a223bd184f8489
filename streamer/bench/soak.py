"""``streamer bench soak``: the server's resident memory and final latency over a long run of N real-time streams.

The performance issue asks for "server resident memory at most 600 MB with 8 streams, flat over a 10-minute run (no
growth with audio processed)". This benchmark measures exactly that, on the server as it is deployed:

1. ``streamer serve`` starts in its own process (``python -m streamer serve``, :mod:`streamer.bench.server_process`)
   on a free loopback port, its log in a temporary file; the benchmark waits for ``/readyz`` (the model loaded and
   warmed up).
2. The baseline is the server's RSS once it is ready, before any stream.
3. ``--streams`` clients (in this process, so their memory does not count) each stream ``--minutes`` of audio paced
   in real time, their starts staggered across one decode step (as ``streamer bench capacity`` does). Meanwhile the
   server's ``VmRSS`` is read from ``/proc/PID/status`` every ``--sample-seconds``; ``VmHWM`` (the peak resident
   size of the whole process life, model loading included) is read at the end.
4. The server is stopped (SIGTERM, then SIGKILL after a grace period), whatever happened, Ctrl-C included.

Figures: baseline, peak (the largest sample and ``VmHWM``), final RSS and RSS once the streams closed; growth, as
the least-squares slope of RSS over the second half of the run (MB per minute, and that slope times the second
half's minutes, with its uncertainty), as the mean RSS of the last minute minus that of the second minute, and as
the same difference of their minima (the floor between batches); final latency p50/p95 per minute of audio; lost
audio; errors. MB are 10^6 bytes (``/proc`` counts KiB), the stricter reading of the issue's "600 MB".

Why the uncertainty and the floor: the engine allocates per batch and gives the pages back after it, so RSS swings
by a hundred MB or more between two samples. A slope fitted through such samples can "grow" 20 MB by chance alone;
the growth target is only judged when the slope's 95% interval is narrower than the target (else: no verdict;
sample more often with ``--sample-seconds`` or run longer), and the floor, which the swings do not reach, is judged
against the same target beside it.

Linux only: the memory comes from ``/proc``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from streamer.bench.harness import (
    LIBRISPEECH_LONGFORM,
    AudioArray,
    StreamRun,
    add_stream_arguments,
    check_stream_arguments,
    load_bench_file,
    stream_file,
    tiled,
)
from streamer.bench.report import (
    Distribution,
    Report,
    add_docs_argument,
    command_line,
    format_table,
    machine_note,
    pyplot,
    save_plot,
    write_report,
)
from streamer.bench.server_process import ServerProcess, free_port, running_server
from streamer.core.errors import ConfigError, StreamerError

__all__ = [
    "Growth",
    "LineFit",
    "MemorySample",
    "MinuteFigures",
    "SoakFigures",
    "check_arguments",
    "configure_parser",
    "fit_line",
    "format_figures",
    "growth",
    "judge",
    "per_minute",
    "plot_memory",
    "run",
    "server_command",
    "verdicts",
]

SECONDS_PER_MINUTE = 60.0
# seconds the server gets to settle (and give pages back) after the last stream closed, before "after" is read
AFTER_SECONDS = 3.0


# ---------------------------------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class MemorySample:
    """The server's resident memory at one moment of the run."""

    # seconds since the first stream started
    elapsed_s: float
    # VmRSS, in MB (10^6 bytes)
    rss_mb: float


@dataclass(frozen=True)
class LineFit:
    """A least-squares line through points (x, y)."""

    slope: float
    # standard error of the slope; None with fewer than three points (no residual to estimate it from)
    slope_stderr: float | None


@dataclass(frozen=True)
class Growth:
    """How RSS moved during the run; every figure is None when too few samples fall in its span."""

    # least-squares slope of RSS against time over the second half of the run, MB per minute
    slope_mb_per_minute: float | None
    # that slope times the second half's length: what the second half added, MB
    second_half_mb: float | None
    # half the 95% interval of second_half_mb (two standard errors of the slope, times the same length), MB
    second_half_uncertainty_mb: float | None
    # mean RSS over the last minute minus mean RSS over the second minute (the first is warm-up), MB
    last_minus_second_minute_mb: float | None
    # the same difference of the minima: the floor between batches, which the per-batch swings do not reach, MB
    floor_growth_mb: float | None


@dataclass(frozen=True)
class MinuteFigures:
    """One minute of audio: its finals' latency over every stream, and the server's RSS meanwhile."""

    minute: int  # 0-based minute of stream audio
    final_ms: Distribution
    rss_mb: float | None  # mean of the samples taken while that minute was streamed


@dataclass(frozen=True)
class SoakFigures:
    """Everything one soak run measured, and what it missed."""

    streams: int
    minutes: float
    baseline_mb: float  # RSS once ready, before any stream
    after_mb: float | None  # RSS once every stream closed and the server settled; None if it was gone
    load_hwm_mb: float  # VmHWM once ready: the peak of loading the model
    samples: tuple[MemorySample, ...]
    hwm_mb: float  # VmHWM at the end of the run
    growth: Growth
    per_minute: tuple[MinuteFigures, ...]
    final_ms: Distribution  # every final of every stream
    finished: int  # streams that ran to their end (a done message)
    lost_seconds: float
    errors: tuple[str, ...]
    failures: tuple[str, ...] = field(default=())  # which targets were missed; empty when all were met

    @property
    def peak_sampled_mb(self) -> float:
        return max((s.rss_mb for s in self.samples), default=self.baseline_mb)

    @property
    def low_sampled_mb(self) -> float:
        return min((s.rss_mb for s in self.samples), default=self.baseline_mb)

    @property
    def peak_mb(self) -> float:
        """The peak resident size: VmHWM, or a sample above it (they are read at different moments)."""
        return max(self.hwm_mb, self.peak_sampled_mb)

    @property
    def end_mb(self) -> float:
        return self.samples[-1].rss_mb if self.samples else self.baseline_mb

    @property
    def held(self) -> bool:
        return not self.failures


# ---------------------------------------------------------------------------------------------------------------------
# Pure computations


def fit_line(points: Sequence[tuple[float, float]]) -> LineFit | None:
    """The least-squares line through ``points`` (x, y); None with fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    variance = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / variance
    if len(points) < 3:
        return LineFit(slope, None)
    residuals = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in points)
    return LineFit(slope, (residuals / (len(points) - 2) / variance) ** 0.5)


def _rss_in(samples: Sequence[MemorySample], start_s: float, end_s: float) -> list[float]:
    """RSS of the samples taken in [start_s, end_s]."""
    return [s.rss_mb for s in samples if start_s <= s.elapsed_s <= end_s]


def _mean_rss(samples: Sequence[MemorySample], start_s: float, end_s: float) -> float | None:
    """Mean RSS of the samples taken in [start_s, end_s]; None when there is none."""
    inside = _rss_in(samples, start_s, end_s)
    return statistics.fmean(inside) if inside else None


def growth(samples: Sequence[MemorySample]) -> Growth:
    """RSS growth over the run the samples cover (from 0 to the last sample)."""
    if not samples:
        return Growth(None, None, None, None, None)
    end = samples[-1].elapsed_s
    half_minutes = end / 2 / SECONDS_PER_MINUTE
    fit = fit_line([(s.elapsed_s / SECONDS_PER_MINUTE, s.rss_mb) for s in samples if s.elapsed_s >= end / 2])
    slope = None if fit is None else fit.slope
    uncertainty = None if fit is None or fit.slope_stderr is None else 2 * fit.slope_stderr * half_minutes
    last = _rss_in(samples, end - SECONDS_PER_MINUTE, end)
    # the second minute is a reference only when the last minute does not overlap it
    second = _rss_in(samples, SECONDS_PER_MINUTE, 2 * SECONDS_PER_MINUTE) if end >= 3 * SECONDS_PER_MINUTE else []
    both = bool(last and second)
    return Growth(
        slope_mb_per_minute=slope,
        second_half_mb=None if slope is None else slope * half_minutes,
        second_half_uncertainty_mb=uncertainty,
        last_minus_second_minute_mb=statistics.fmean(last) - statistics.fmean(second) if both else None,
        floor_growth_mb=min(last) - min(second) if both else None,
    )


def per_minute(runs: Sequence[StreamRun], samples: Sequence[MemorySample], speed: float = 1.0) -> list[MinuteFigures]:
    """Final latency per minute of audio (by where each final ends), with the mean RSS while it was streamed."""
    by_minute: dict[int, list[float]] = {}
    for run in runs:
        for final in run.finals:
            by_minute.setdefault(int(final.end // SECONDS_PER_MINUTE), []).append(final.latency_ms)
    minutes = max((run.audio_seconds for run in runs), default=0.0) / SECONDS_PER_MINUTE
    count = max(1, int(-(-minutes // 1)))
    # a final that ends with the audio (at exactly N minutes) belongs to the last minute, not to one after it
    for late in [m for m in by_minute if m >= count]:
        by_minute.setdefault(count - 1, []).extend(by_minute.pop(late))
    wall = SECONDS_PER_MINUTE / speed  # wall seconds one minute of audio takes to stream
    return [
        MinuteFigures(m, Distribution.of(by_minute.get(m, [])), _mean_rss(samples, m * wall, (m + 1) * wall))
        for m in range(count)
    ]


def verdicts(figures: SoakFigures, limit_mb: float, max_growth_mb: float) -> list[tuple[str, bool | None, str]]:
    """(target, met, what was measured) for each target; met is None when nothing was measured."""
    second_half = figures.growth.second_half_mb
    uncertainty = figures.growth.second_half_uncertainty_mb
    grown: bool | None
    if second_half is None or uncertainty is None:
        grown, measured = None, "too few samples"
    elif uncertainty > max_growth_mb:
        # the samples' scatter alone could make or break the target: no verdict either way
        grown, measured = None, f"{second_half:+.1f} ± {uncertainty:.1f} MB: the scatter exceeds the target"
    else:
        grown, measured = second_half <= max_growth_mb, f"{second_half:+.1f} ± {uncertainty:.1f} MB"
    floor = figures.growth.floor_growth_mb
    unserved = figures.streams - figures.finished
    return [
        (f"peak RSS <= {limit_mb:g} MB", figures.peak_mb <= limit_mb, f"{figures.peak_mb:.0f} MB"),
        (f"RSS growth over the second half <= {max_growth_mb:g} MB", grown, measured),
        (
            f"RSS floor growth (minimum of the last minute minus that of the second) <= {max_growth_mb:g} MB",
            None if floor is None else floor <= max_growth_mb,
            "a run under 3 minutes has none" if floor is None else f"{floor:+.1f} MB",
        ),
        (
            f"all {figures.streams} streams served to the end, no audio lost, no error",
            unserved == 0 and figures.lost_seconds == 0 and not figures.errors,
            f"{figures.finished} finished, {figures.lost_seconds:.1f} s lost, {len(figures.errors)} error(s)",
        ),
    ]


def judge(figures: SoakFigures, limit_mb: float, max_growth_mb: float) -> SoakFigures:
    """``figures`` with its failures filled in: every target missed or not measured."""
    failures = tuple(
        f"{target}: {measured}" for target, met, measured in verdicts(figures, limit_mb, max_growth_mb) if not met
    )
    return replace(figures, failures=failures)


def format_figures(figures: SoakFigures, args: argparse.Namespace) -> str:
    """The Markdown body: the per-minute table, the memory and latency summary, the targets."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    def mb(value: float | None, sign: str = "") -> str:
        return "-" if value is None else f"{value:{sign}.1f}"

    f = figures
    g = f.growth
    rows = [
        [str(m.minute + 1), mb(m.rss_mb), str(m.final_ms.count), ms(m.final_ms.p50), ms(m.final_ms.p95)]
        for m in f.per_minute
    ]
    first = f.per_minute[0].final_ms if f.per_minute else Distribution.of([])
    last = f.per_minute[-1].final_ms if f.per_minute else Distribution.of([])
    lines = [
        f"{f.streams} stream(s) of {f.minutes:g} min of audio ({Path(args.file).name}, tiled) at {args.speed:g}x real "
        f"time, starts staggered over one step ({args.step_ms} ms), against `streamer serve` ({args.model}, config "
        f"{args.config}) in its own process; its VmRSS read from /proc every {args.sample_seconds:g} s "
        f"({len(f.samples)} samples). MB: 10^6 bytes.",
        "",
        format_table(["minute", "RSS MB", "finals", "final p50 ms", "final p95 ms"], rows),
        "",
        f"Memory: baseline {f.baseline_mb:.1f} MB (ready, before any stream; loading peaked at {f.load_hwm_mb:.1f}), "
        f"peak {f.peak_mb:.1f} MB (largest sample {f.peak_sampled_mb:.1f}, VmHWM {f.hwm_mb:.1f}), "
        f"samples {f.low_sampled_mb:.1f} to {f.peak_sampled_mb:.1f} MB, last sample {f.end_mb:.1f} MB, "
        f"{AFTER_SECONDS:g} s after the streams closed {mb(f.after_mb)} MB.",
        f"Growth: {mb(g.slope_mb_per_minute, '+')} MB/min over the second half (least squares), "
        f"{mb(g.second_half_mb, '+')} ± {mb(g.second_half_uncertainty_mb)} MB over the second half (95%); "
        f"last minute minus second minute: mean {mb(g.last_minus_second_minute_mb, '+')} MB, "
        f"floor (minimum) {mb(g.floor_growth_mb, '+')} MB.",
        f"Final latency: first minute p50 {ms(first.p50)} / p95 {ms(first.p95)} ms, last minute p50 {ms(last.p50)} / "
        f"p95 {ms(last.p95)} ms; whole run {f.final_ms.format('ms')}.",
        f"Streams: {f.finished} of {f.streams} ran to the end; {f.lost_seconds:.1f} s of audio lost; "
        f"{len(f.errors)} error(s).",
        "",
        "Targets (performance issue):",
        "",
    ]
    for target, met, measured in verdicts(f, args.limit_mb, args.max_growth_mb):
        verdict = "no verdict" if met is None else ("met" if met else "MISSED")
        lines.append(f"- {target}: {measured}, {verdict}")
    if f.errors:
        lines += ["", "Errors:", "", *(f"- {e}" for e in f.errors)]
    return "\n".join(lines)


def plot_memory(path: Path, title: str, figures: SoakFigures, limit_mb: float) -> bool:
    """RSS (MB) against minutes of the run, with the baseline, the peak (VmHWM) and the limit; False if not drawn."""
    plt = pyplot()
    if plt is None:
        return False
    f = figures
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot([s.elapsed_s / SECONDS_PER_MINUTE for s in f.samples], [s.rss_mb for s in f.samples], label="VmRSS")
    axes.axhline(f.baseline_mb, linestyle=":", color="grey", label=f"baseline {f.baseline_mb:.0f} MB")
    axes.axhline(f.hwm_mb, linestyle="-.", color="orange", label=f"VmHWM (peak) {f.hwm_mb:.0f} MB")
    axes.axhline(limit_mb, linestyle="--", color="red", label=f"limit {limit_mb:.0f} MB")
    axes.set(xlabel="minutes since the first stream started", ylabel="server resident memory (MB)", title=title)
    return save_plot(plt, figure, axes, path)


# ---------------------------------------------------------------------------------------------------------------------
# The run


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    """``python -m streamer serve`` with the model, configuration and windowing of ``args`` on ``port``."""
    from streamer.engine import CONFIGS  # no torch: the configurations are plain options

    options = CONFIGS[args.config]
    command = [sys.executable, "-m", "streamer", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-auth"]
    command += ["--model", args.model, "--max-sessions", str(args.streams)]
    command += ["--step-ms", str(args.step_ms), "--endpoint-ms", str(args.endpoint_ms)]
    for flag, value in (
        ("--encoder-precision", options.encoder_precision),
        ("--encoder-device", options.encoder_device),
        ("--decoder-precision", options.decoder_precision),
        ("--decoder-device", options.decoder_device),
        ("--threads", args.threads),
    ):
        if value is not None:
            command += [flag, str(value)]
    if args.speed > 1:
        # faster than real time on purpose: the server's audio rate limit would throttle the clients
        command += ["--max-audio-rate", "0"]
    return command


async def _soak(
    server: ServerProcess, samples: AudioArray, args: argparse.Namespace
) -> tuple[list[StreamRun], list[MemorySample], list[str]]:
    """Stream ``args.streams`` clients at once while sampling the server's RSS; the runs, samples and errors."""
    stagger = args.step_ms / 1000 / args.streams / args.speed
    started = time.monotonic()
    memory: list[MemorySample] = []
    done = asyncio.Event()

    async def sample() -> None:
        while True:
            try:
                rss = server.memory().rss_mb
            except OSError:  # the server is gone: the clients see it too
                return
            memory.append(MemorySample(time.monotonic() - started, rss))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), args.sample_seconds)
            if done.is_set():
                return

    sampler = asyncio.create_task(sample())
    outcomes = await asyncio.gather(
        *(
            stream_file(server.url, f"stream {i}", samples, speed=args.speed, chunk_ms=args.chunk_ms, delay=i * stagger)
            for i in range(args.streams)
        ),
        return_exceptions=True,
    )
    done.set()
    await sampler
    runs = [o for o in outcomes if isinstance(o, StreamRun)]
    failed = [f"stream {i}: {type(o).__name__}: {o}" for i, o in enumerate(outcomes) if isinstance(o, BaseException)]
    return runs, memory, failed


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=int, default=8, help="concurrent real-time streams (default: 8)")
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of audio per stream (default: 10)")
    parser.add_argument("--file", type=Path, default=LIBRISPEECH_LONGFORM, help="audio every stream sends, tiled")
    parser.add_argument(
        "--sample-seconds", type=float, default=5.0, help="seconds between two reads of the server's RSS (default: 5)"
    )
    parser.add_argument("--limit-mb", type=float, default=600.0, help="peak RSS limit, MB (default: 600)")
    parser.add_argument(
        "--max-growth-mb", type=float, default=20.0, help="RSS growth allowed over the second half, MB (default: 20)"
    )
    parser.add_argument("--model", default="tiny.en", help="model name or directory (default: %(default)s)")
    parser.add_argument("--config", default="default", help="engine configuration (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="model CPU threads (default: one per core)")
    parser.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds the server may take to load (default: 300)"
    )
    add_stream_arguments(parser)
    add_docs_argument(parser)


def check_arguments(args: argparse.Namespace) -> None:
    """Raise :class:`~streamer.core.errors.ConfigError` for what no run can honour, before starting anything."""
    if not sys.platform.startswith("linux"):
        raise ConfigError("streamer bench soak reads the server's memory from /proc/PID/status: Linux only")
    check_stream_arguments(argparse.Namespace(**vars(args), engine="real"))  # the server runs the real model
    if args.streams < 1:
        raise ConfigError("--streams must be at least 1")
    positive = {
        "--minutes": args.minutes,
        "--sample-seconds": args.sample_seconds,
        "--limit-mb": args.limit_mb,
        "--ready-timeout": args.ready_timeout,
    }
    for option, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{option} must be > 0")
    if args.max_growth_mb < 0:
        raise ConfigError("--max-growth-mb must be >= 0")
    if not args.file.exists():
        raise ConfigError(f"{args.file}: no such file")


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    machine = machine_note()
    samples = tiled(load_bench_file(args.file).samples, args.minutes * SECONDS_PER_MINUTE)
    port = free_port()
    with running_server(server_command(args, port), port, args.ready_timeout) as server:
        ready = server.memory()
        time.sleep(1.0)  # let the warm-up's garbage settle
        baseline = server.memory().rss_mb
        print(
            f"ready on port {port}: RSS {baseline:.1f} MB; {args.streams} stream(s) of {args.minutes:g} min ...",
            file=sys.stderr,
        )
        runs, memory, failed = asyncio.run(_soak(server, samples, args))
        time.sleep(AFTER_SECONDS)
        try:
            after = server.memory()
        except OSError:
            raise StreamerError(f"the server died during the run; its log ends:\n{server.log_tail()}") from None
    figures = judge(
        SoakFigures(
            streams=args.streams,
            minutes=args.minutes,
            baseline_mb=baseline,
            after_mb=after.rss_mb,
            load_hwm_mb=ready.hwm_mb,
            samples=tuple(memory),
            hwm_mb=after.hwm_mb,
            growth=growth(memory),
            per_minute=tuple(per_minute(runs, memory, args.speed)),
            final_ms=Distribution.of(t.latency_ms for r in runs for t in r.finals),
            finished=sum(1 for r in runs if r.done is not None),
            lost_seconds=sum(r.done.lost_seconds for r in runs if r.done is not None),
            errors=tuple(failed + [e for r in runs for e in r.errors]),
        ),
        args.limit_mb,
        args.max_growth_mb,
    )
    body = format_figures(figures, args)
    print(body)
    plot = "soak-memory.png"
    drawn = plot_memory(
        args.docs / "benchmarks" / plot,
        f"soak, {args.model} ({args.config}), {args.streams} streams of {args.minutes:g} min",
        figures,
        args.limit_mb,
    )
    json_figures = {
        "machine": machine,
        "file": str(args.file),
        "server": server_command(args, port)[1:],
        "figures": figures,
        "peak_mb": figures.peak_mb,
        "peak_sampled_mb": figures.peak_sampled_mb,
        "end_mb": figures.end_mb,
        "held": figures.held,
        "verdicts": [
            {"target": t, "met": m, "measured": v} for t, m, v in verdicts(figures, args.limit_mb, args.max_growth_mb)
        ],
    }
    report = Report("soak", command_line("soak", args), body, json_figures, (plot,) if drawn else ())
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
