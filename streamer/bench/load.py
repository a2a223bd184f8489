"""``streamer bench load``: the host's own work per real-time stream, with the server and its clients in separate
processes as deployed (issue 37: at a thousand streams the frames, VAD, resampling, agreement, JSON and WebSocket
writes must fit the host's cores).

1. ``streamer serve --engine scripted`` starts in its own process (:mod:`streamer.bench.server_process`): no model,
   a word every 0.35 s of any speech, each engine call sleeping the decode cost given (``--scripted-window-ms``,
   ``--scripted-batch-ms``), so the server's CPU is the host's share alone. With ``--engine whisper`` it serves the
   model instead (``--model``; placement and precision the server's defaults, FP16 on a GPU, or ``--server-arg``):
   the ramp of a thousand streams on a GPU (bench/gpu.sh), where the server's CPU is the host's share plus the
   engine's host work. ``--server-processes N`` starts N such servers, each with its own engine (on one GPU, the
   model once in each), and the bench spreads each step's streams over them round-robin, as a proxy in front of
   replicas would (docs/operations.md): one process's event loop and interpreter lock carry a few hundred streams,
   so a thousand on one GPU take several.
2. For each step of the ramp (``--streams 1,8,32,64,128``), N clients stream the file paced in real time, spread
   over ``--client-processes`` processes (the clients' own work must not share the server's event loop or GIL),
   their starts staggered over ``--stagger`` seconds. Every process waits until all are loaded, then all start.
3. Per step: the speaker-measured final delay (from the sending of the audio of a final's last word to the final's
   arrival, on the client's clock), the lag growth of finals, the streams that failed, the audio lost, and the
   server process's CPU seconds per stream-second (``/proc/PID/stat``), judged as ``streamer bench capacity`` judges
   a step (:func:`streamer.bench.capacity.failures_of`), plus: no stream may fail. The ramp stops at the first
   step that fails.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import shutil
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from streamer.bench.accuracy import final_delays
from streamer.bench.capacity import failures_of, lag_growth
from streamer.bench.clients import ClientProcesses, ClientShare, ClientStream
from streamer.bench.harness import LIBRISPEECH_LONGFORM, AudioArray, StreamRun, load_bench_file, tiled
from streamer.bench.report import Distribution, Report, add_docs_argument, command_line, format_table, write_report
from streamer.bench.server_process import (
    ServerProcess,
    free_ports,
    read_cpu_seconds,
    running_redis,
    running_servers,
    wait_workers_ready,
)
from streamer.core.errors import ConfigError

__all__ = [
    "LoadStep",
    "configure_parser",
    "judge",
    "measure_step",
    "parse_steps",
    "run",
    "section_name",
    "server_command",
]

# the server's counters (GET /metrics) a step reads before and after: the engine's share of the delay
COUNTERS = ("streamer_windows_total", "streamer_batches_total", "streamer_engine_busy_seconds_total")
# read_counters' count of the engines behind a server (its workers), and the prefix of each one's windows
ENGINES = "engines"
WINDOWS_OF = "windows of "


def parse_steps(text: str) -> list[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]``; raises :class:`ConfigError` unless it is increasing positive integers."""
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--streams must be comma-separated numbers of streams, not {text!r}") from None
    if not steps or steps[0] < 1 or any(b <= a for a, b in itertools.pairwise(steps)):
        raise ConfigError(f"--streams must be increasing numbers of streams, at least 1, not {text!r}")
    return steps


@dataclass(frozen=True)
class LoadStep:
    """The figures of N concurrent streams against the server process, and whether N held."""

    streams: int
    final_ms: Distribution  # speaker-measured: a final's arrival minus the sending of its last word's end
    server_final_ms: Distribution  # the server's latency_ms of the same finals
    lag_early_s: float | None  # median lag of finals in the first third of the audio
    lag_late_s: float | None  # ... in the last third
    failed_streams: int  # streams that could not connect, were dropped, got error messages or no summary
    lost_seconds: float
    errors: tuple[str, ...]  # why each failed stream failed (the first few)
    wall_seconds: float  # from the common start to the last client's result
    stream_seconds: float  # audio streamed: N times the duration
    server_cpu_seconds: float  # user + system CPU of the server process over the step
    client_cpu_seconds: float  # the same, over the client processes
    windows: int = 0  # windows the engine decoded over the step (the server's /metrics)
    batches: int = 0  # engine calls
    engine_busy_seconds: float = 0.0  # wall time the engines spent in calls (the scripted cost slept), all together
    servers: int = 1  # server processes the streams were spread over (each with its own engine)
    engines: int = 0  # engines behind them (a server's --workers each have one; 0: one per server)
    server_windows: tuple[int, ...] = ()  # windows each server process decoded over the step, in order
    engine_windows: tuple[int, ...] = ()  # ... each engine (a server's workers in turn), in order
    failures: tuple[str, ...] = field(default=())  # why it did not hold; empty when it held

    @property
    def lag_growth_s(self) -> float | None:
        if self.lag_early_s is None or self.lag_late_s is None:
            return None
        return self.lag_late_s - self.lag_early_s

    @property
    def server_cpu_per_stream_second(self) -> float:
        """The server's CPU seconds per second of one stream's audio: the host's cost of a real-time stream, in
        cores (1000 streams need a thousand times this many cores)."""
        return self.server_cpu_seconds / self.stream_seconds if self.stream_seconds else 0.0

    @property
    def server_cores(self) -> float:
        """Cores the server processes kept busy on average over the step, all together."""
        return self.server_cpu_seconds / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def engine_busy(self) -> float:
        """An engine's busy fraction of the step's wall time, the mean over the server processes: near 1, the
        engines, not the host, set the delay."""
        engines = self.engines or self.servers
        return self.engine_busy_seconds / (self.wall_seconds * engines) if self.wall_seconds else 0.0

    @property
    def held(self) -> bool:
        return not self.failures


def read_counters(server: ServerProcess) -> dict[str, float]:
    """The server's :data:`COUNTERS` now, from ``GET /metrics`` (Prometheus' text format)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    values = dict.fromkeys((*COUNTERS, ENGINES), 0.0)
    for line in text.splitlines():
        # a sample is "name value" or "name{labels} value"; with --workers every worker's carries its worker label,
        # and the server's figure is their sum
        series = line.split(" ", 1)[0]
        name = series.split("{", 1)[0]
        if name not in COUNTERS:
            continue
        value = float(line.rsplit(" ", 1)[1])
        values[name] += value
        if name == "streamer_windows_total":
            values[f"{WINDOWS_OF}{series}"] = value  # each engine's, by its labels
        if name == "streamer_engine_busy_seconds_total":
            values[ENGINES] += 1  # one engine per worker (one series each)
    return values


def judge(step: LoadStep, limit_ms: float, max_lag_growth: float) -> LoadStep:
    """``step`` with its failures filled in: the capacity bench's rules, and no stream may fail."""
    failures = failures_of(step.final_ms, step.lag_growth_s, step.lost_seconds, (), limit_ms, max_lag_growth)
    if step.failed_streams:
        failures += (f"{step.failed_streams} stream(s) failed",)
    return replace(step, failures=failures)


def server_command(args: argparse.Namespace, port: int, max_sessions: int) -> list[str]:
    """``python -m streamer serve`` on ``port``: the scripted engine at the decode cost of ``args``, or the model
    (``--engine whisper --model``)."""
    command = [sys.executable, "-m", "streamer", "serve", "--engine", args.engine, "--host", "127.0.0.1"]
    command += ["--port", str(port), "--max-sessions", str(max_sessions)]
    if args.engine == "scripted":
        command += [
            "--scripted-window-ms",
            f"{args.scripted_window_ms:g}",
            "--scripted-batch-ms",
            f"{args.scripted_batch_ms:g}",
        ]
    else:
        command += ["--model", args.model]
    if args.max_batch_size is not None:
        command += ["--max-batch-size", str(args.max_batch_size)]
    if getattr(args, "workers", 1) > 1:
        command += ["--workers", str(args.workers), "--redis", args.redis]
    if args.speed > 1:
        # faster than real time on purpose: the server's audio rate limit would throttle the clients
        command += ["--max-audio-rate", "0"]
    return command + list(args.server_arg)


def section_name(args: argparse.Namespace) -> str:
    """The report's section: ``load`` for the scripted engine, ``load-whisper`` for the model (their figures differ
    in kind: the host's share alone, or with the engine's)."""
    return "load" if args.engine == "scripted" else "load-whisper"


def measure_step(servers: Sequence[ServerProcess], samples: AudioArray, n: int, args: argparse.Namespace) -> LoadStep:
    """N streams of ``samples`` spread over ``servers`` round-robin (stream i to server i mod their number) and over
    the client processes; the figures of that step, the servers' CPU and engine counters summed."""
    processes = min(args.client_processes, n)
    streams = [
        ClientStream(f"stream {i}", samples, i * args.stagger / n, servers[i % len(servers)].url) for i in range(n)
    ]
    shares = [
        ClientShare(servers[0].url, tuple(streams[p::processes]), args.speed, args.chunk_ms) for p in range(processes)
    ]
    # 1. every client process loaded (on entering), so that the starts are staggered as asked and not by imports
    with ClientProcesses(shares) as clients:
        # 2. the common start, and the servers' CPU from there
        cpu = _servers_cpu_seconds(servers)
        counters = [read_counters(server) for server in servers]
        started = time.monotonic()
        # 3. every process's streams, ended (4. on leaving: the client processes gone, whatever happened)
        outcomes = clients.run()
        wall = time.monotonic() - started
        server_cpu = _servers_cpu_seconds(servers) - cpu
        after = [read_counters(server) for server in servers]
        each = [{name: a[name] - b[name] for name in COUNTERS} for a, b in zip(after, counters, strict=True)]
        counted = {name: sum(server[name] for server in each) for name in COUNTERS}
    runs = [r for o in outcomes for r in o.runs]
    failed = [f for o in outcomes for f in o.failed]
    failed += [f"{r.file}: {'; '.join(r.errors) or 'no summary (done) from the server'}" for r in runs if _failed(r)]
    early, late = lag_growth(runs)
    return LoadStep(
        streams=n,
        final_ms=Distribution.of(1000 * d for r in runs for d in final_delays(r)),
        server_final_ms=Distribution.of(t.latency_ms for r in runs for t in r.finals if t.words),
        lag_early_s=early,
        lag_late_s=late,
        failed_streams=len(failed),
        lost_seconds=sum(r.done.lost_seconds for r in runs if r.done is not None),
        errors=tuple(failed[:5]),
        wall_seconds=wall,
        stream_seconds=n * len(samples) / 16000,
        server_cpu_seconds=server_cpu,
        client_cpu_seconds=sum(o.cpu_seconds for o in outcomes),
        windows=round(counted["streamer_windows_total"]),
        batches=round(counted["streamer_batches_total"]),
        engine_busy_seconds=counted["streamer_engine_busy_seconds_total"],
        servers=len(servers),
        engines=round(sum(server[ENGINES] for server in after)),
        server_windows=tuple(round(server["streamer_windows_total"]) for server in each),
        engine_windows=tuple(
            round(a[name] - b.get(name, 0.0))
            for a, b in zip(after, counters, strict=True)
            for name in a
            if name.startswith(WINDOWS_OF)
        ),
    )


def _servers_cpu_seconds(servers: Sequence[ServerProcess]) -> float:
    return sum(read_cpu_seconds(server.process.pid) for server in servers)


def _failed(run: StreamRun) -> bool:
    return bool(run.errors) or run.done is None


def configure_parser(parser: argparse.ArgumentParser) -> None:
    from streamer.cli.serve import add_scripted_cost_arguments

    parser.add_argument(
        "--streams", default="1,8,32,64,128", help="the ramp: concurrent streams per step (default: %(default)s)"
    )
    parser.add_argument(
        "--client-processes", type=int, default=2, help="processes the clients are spread over (default: 2)"
    )
    parser.add_argument(
        "--server-processes",
        type=int,
        default=1,
        help="server processes, each with its own engine; streams go to them round-robin (default: 1)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="each server is streamer serve --workers N: N engine processes on its one port (default: 1)",
    )
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=None,
        help="with --workers above 1: the Redis they share (default: a redis-server of the bench's own)",
    )
    parser.add_argument(
        "--stagger", type=float, default=2.0, help="seconds over which a step's starts spread (default: 2)"
    )
    parser.add_argument("--file", type=Path, default=LIBRISPEECH_LONGFORM, help="audio every stream sends")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of audio per stream (default: 30)")
    parser.add_argument("--speed", type=float, default=1.0, help="pace relative to real time (default: 1)")
    parser.add_argument("--chunk-ms", type=int, default=100, help="audio per frame, 20 to 100 ms (default: 100)")
    parser.add_argument(
        "--limit-ms", type=float, default=1500.0, help="speaker-measured final delay p95 limit (default: 1500)"
    )
    parser.add_argument(
        "--max-lag-growth", type=float, default=1.0, help="seconds the final lag may grow, early to late (default: 1)"
    )
    parser.add_argument(
        "--engine",
        choices=["scripted", "whisper"],
        default="scripted",
        help="the server's engine: the scripted one (the host's share alone) or the model (default: %(default)s)",
    )
    parser.add_argument("--model", default="tiny.en", help="with --engine whisper: the model (default: %(default)s)")
    add_scripted_cost_arguments(parser)
    parser.add_argument(
        "--max-batch-size", type=int, default=None, help="windows per engine call (default: the server's default)"
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for streamer serve, verbatim (repeatable: --server-arg=--step-ms --server-arg=300)",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=120.0, help="seconds the server may take to get ready (default: 120)"
    )
    add_docs_argument(parser)


def check_arguments(args: argparse.Namespace) -> list[int]:
    """The ramp; raises :class:`ConfigError` for the first bad option."""
    from streamer.cli.serve import scripted_cost_from

    steps = parse_steps(args.streams)
    scripted_cost_from(args)
    if args.engine != "scripted" and (args.scripted_window_ms or args.scripted_batch_ms):
        raise ConfigError(
            "--scripted-window-ms and --scripted-batch-ms are the scripted engine's: drop them or use --engine scripted"
        )
    if args.client_processes < 1:
        raise ConfigError("--client-processes must be at least 1")
    if args.server_processes < 1:
        raise ConfigError("--server-processes must be at least 1")
    if args.workers < 1:
        raise ConfigError("--workers must be at least 1")
    if args.workers > 1 and args.redis is None and shutil.which("redis-server") is None:
        raise ConfigError("--workers above 1 needs a Redis: --redis URL, or redis-server on the PATH")
    if not args.stagger >= 0:
        raise ConfigError("--stagger must be >= 0")
    if not args.duration > 0:
        raise ConfigError("--duration must be > 0")
    if not args.speed > 0:
        raise ConfigError("--speed must be > 0 (the clients pace the audio)")
    if not 20 <= args.chunk_ms <= 100:
        raise ConfigError("--chunk-ms must be between 20 and 100")
    if args.max_batch_size is not None and args.max_batch_size < 1:
        raise ConfigError("--max-batch-size must be at least 1")
    if not args.file.exists():
        raise ConfigError(f"{args.file}: no such file")
    return steps


def format_steps(steps: list[LoadStep], args: argparse.Namespace) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    rows = [
        [
            str(s.streams),
            ms(s.final_ms.p50),
            ms(s.final_ms.p95),
            ms(s.server_final_ms.p95),
            "-" if s.lag_growth_s is None else f"{s.lag_growth_s:+.2f}",
            str(s.failed_streams),
            f"{s.lost_seconds:.1f}",
            f"{1000 * s.server_cpu_per_stream_second:.1f}",
            f"{s.server_cores:.2f}",
            f"{s.client_cpu_seconds / s.wall_seconds if s.wall_seconds else 0:.2f}",
            f"{100 * s.engine_busy:.0f}%",
            f"{s.windows / s.batches if s.batches else 0:.1f}",
            "held" if s.held else "FAILED: " + "; ".join(s.failures),
        ]
        for s in steps
    ]
    header = [
        "streams",
        "final p50 ms",
        "final p95 ms",
        "server final p95 ms",
        "lag growth s",
        "failed",
        "lost s",
        "server CPU ms per stream-s",
        "server cores",
        "client cores",
        "engine busy",
        "batch",
        "verdict",
    ]
    held = [s for s in steps if s.held]
    where = (
        "in its own process"
        if args.server_processes == 1
        else f"in {args.server_processes} processes, each with its own engine, the streams spread over them "
        "round-robin as a proxy in front of replicas would (server CPU: all of them together; engine busy: their mean)"
    )
    if args.workers > 1:
        where += (
            f", each `--workers {args.workers}` ({args.workers} engine processes on its port, sharing a Redis; engine "
            "busy: the engines' mean; windows per engine in the JSON)"
        )
    if args.engine == "scripted":
        engine = (
            f"`streamer serve --engine scripted` {where}, decode cost {args.scripted_batch_ms:g} ms per "
            f"call + {args.scripted_window_ms:g} ms per window"
        )
    else:
        engine = (
            f"`streamer serve --engine whisper --model {args.model}` {where} (the server's placement and precision "
            "unless --server-arg says otherwise: FP16 on a GPU); server CPU holds the engine's host work"
        )
    lines = [
        f"{engine}; {args.duration:g} s of audio per stream at {args.speed:g}x real "
        f"time from {args.client_processes} client process(es), starts staggered over {args.stagger:g} s; limits: "
        f"final p95 <= {args.limit_ms:.0f} ms, lag growth <= {args.max_lag_growth:g} s, nothing lost, no stream "
        "failed. The final delay is the speaker's: from the sending of the audio of a final's last word to the "
        "final's arrival, on the client's clock. Server CPU is the server processes' user + system time over the "
        "step, their workers' included.",
        "",
        format_table(header, rows),
        "",
        f"Largest number of concurrent real-time streams held: {held[-1].streams if held else 0}",
    ]
    if held:
        cores = 1000 * held[-1].server_cpu_per_stream_second
        lines.append(f"At that step's cost per stream, 1000 real-time streams need {cores:.1f} cores of server CPU.")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    ramp = check_arguments(args)
    file = load_bench_file(args.file)
    samples = tiled(file.samples, args.duration)
    sessions = -(-ramp[-1] // args.server_processes)  # each server's share of the last step, at most
    steps: list[LoadStep] = []
    with contextlib.ExitStack() as stack:
        if args.workers > 1 and args.redis is None:
            args.redis = stack.enter_context(running_redis())
        commands = [(server_command(args, port, sessions), port) for port in free_ports(args.server_processes)]
        servers = stack.enter_context(running_servers(commands, args.ready_timeout))
        for server in servers:
            wait_workers_ready(server, args.workers, args.ready_timeout)
        for n in ramp:
            print(f"{n} concurrent stream(s) of {args.duration:g} s ...", file=sys.stderr)
            step = judge(measure_step(servers, samples, n, args), args.limit_ms, args.max_lag_growth)
            steps.append(step)
            print(f"  final p95 {step.final_ms.p95} ms, {'held' if step.held else step.failures}", file=sys.stderr)
            if not step.held:
                break
    body = format_steps(steps, args)
    print(body)
    figures = {
        "file": str(args.file),
        "server_processes": args.server_processes,
        "largest_held": max((s.streams for s in steps if s.held), default=0),
        "steps": [
            {
                **s.__dict__,
                "lag_growth_s": s.lag_growth_s,
                "server_cpu_per_stream_second": s.server_cpu_per_stream_second,
                "server_cores": s.server_cores,
                "engine_busy": s.engine_busy,
                "held": s.held,
            }
            for s in steps
        ],
    }
    report = Report(section_name(args), command_line("load", args), body, figures, ())
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
