"""``streamer bench accuracy``: streamed against offline WER over the whole evaluation set, with the delay a speaker
feels (issue 16).

The set is :func:`streamer.bench.evalset.build_set`'s (long-form, joined LibriSpeech speaker runs, telephony,
conversation; about 18 minutes of audio), split by speaker into a tuning half and a report half (issue 39): every
default is chosen on the tuning half, and the targets are judged on the report half, which nobody tuned on
(``--half`` runs one). Each stream is sent by ``--streams`` concurrent clients (their starts staggered over one step,
or all at once), then transcribed offline by the same engine. Per stream, per group and half, per half and pooled:

- streamed WER, own offline WER and the gap, with Whisper's English normaliser;
- the **speaker-measured final delay** (p50, p90, p95, max): from the moment the client sent the audio of a final's
  last word (its end time on the stream clock, mapped to the wall time its chunk was sent) to the moment the final
  arrived, on the client's clock; the server's ``latency_ms`` is reported beside it as the server's share (it starts
  when the server received the end of the decoded window, so it leaves out the wait for the end point and the step);
- the time to first partial: from sending the end of the first word of the first text to receiving that text;
- in the accelerated mode, which sees the core's events, the errors by commit route (issue 39): each error of the
  streamed transcript is charged to the final it falls in (a missing word to the final before the gap), and each
  final says how its words were committed (:class:`~streamer.core.events.CommitRoute`: settled by the policy while
  the utterance went on, forced by the window limit, by the window that closed the utterance, or before a resume).

Two modes: ``realtime`` streams through an in-process server with the protocol v1 client, paced in real time, the
clients in a process of their own (``--clients process``, :mod:`streamer.bench.clients`; ``inline``: in the
server's process, sharing its GIL);
``accelerated`` (the default) runs the server's core and scheduler on a simulated clock with the engine's real decode
times charged to it (:mod:`streamer.bench.simulate`), many times faster. ``--validate`` runs both on the same streams
(one stream, then N staggered and N together) and prints them side by side against a stated tolerance.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from streamer.bench.clients import ClientShare, ClientStream, add_clients_argument, stream_clients
from streamer.bench.evalset import GROUPS, HALVES, EvalStream, build_set
from streamer.bench.harness import (
    BenchFile,
    EngineWork,
    FakeTimeline,
    RecordingEngine,
    StreamRun,
    add_engine_arguments,
    add_stream_arguments,
    bench_config,
    bench_scheduler,
    check_stream_arguments,
    make_engine,
    serve,
)
from streamer.bench.report import Report, add_docs_argument, command_line, format_table, machine_note, write_report
from streamer.cli.workers import WorkerThreads
from streamer.cli.workers import worker_threads as threads_of
from streamer.core.errors import ConfigError, StreamerError
from streamer.core.options import CoreOptions
from streamer.core.units import SAMPLE_RATE
from streamer.offline.normalize import WerResult
from streamer.server.metrics import percentile

__all__ = [
    "TARGETS",
    "TOLERANCE",
    "AccuracyTargets",
    "Delays",
    "RouteErrors",
    "StreamMeasured",
    "Tolerance",
    "configure_parser",
    "core_options",
    "final_delays",
    "first_partial_delay",
    "measure",
    "pool",
    "route_errors",
    "run",
    "section_name",
    "sent_at",
    "starts",
]


@dataclass(frozen=True)
class AccuracyTargets:
    """The done-when of issues 16 and 39, pooled over the report half of the set (the whole set when a run has no
    report half)."""

    wer_gap_points: float = 0.5  # streamed WER at most offline WER + this
    final_p95_one: float = 1.5  # speaker-measured final delay p95 (s), one stream
    final_p95_staggered: float = 2.0  # ... 8 streams starting over one step
    final_p95_together: float = 2.5  # ... 8 streams starting at once
    first_partial_p50: float = 0.6  # time to first partial p50 (s)


TARGETS = AccuracyTargets()


@dataclass(frozen=True)
class Tolerance:
    """How close the accelerated mode must come to a real-time run to be trusted (``--validate``)."""

    wer_points: float = 1.0  # pooled streamed WER
    delay_seconds: float = 0.25  # each delay percentile: within this many seconds ...
    delay_fraction: float = 0.25  # ... or this fraction of the real-time figure, whichever is larger

    def delay_ok(self, accelerated: float | None, realtime: float | None) -> bool | None:
        if accelerated is None or realtime is None:
            return None
        return abs(accelerated - realtime) <= max(self.delay_seconds, self.delay_fraction * realtime)


TOLERANCE = Tolerance()


# ---------------------------------------------------------------------------------------------------------------------
# Delays, as the client measures them


@dataclass(frozen=True)
class Delays:
    """Percentiles of a sample of delays in seconds; None where the sample is empty."""

    count: int
    p50: float | None
    p90: float | None
    p95: float | None
    max: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Delays:
        data = list(values)
        return cls(
            len(data), percentile(data, 50), percentile(data, 90), percentile(data, 95), max(data) if data else None
        )


def sent_at(run: StreamRun, seconds: float) -> float | None:
    """When the client sent the sample at stream time ``seconds`` (the end of a word: the sample just before it), on
    the run's clock; None for a run without send times."""
    if not run.sent or run.chunk_samples <= 0:
        return None
    sample = max(0, round(seconds * SAMPLE_RATE) - 1)
    return run.sent[min(sample // run.chunk_samples, len(run.sent) - 1)]


def final_delays(run: StreamRun) -> list[float]:
    """The speaker-measured delay of every final with words: its arrival minus the sending of its last word's end."""
    delays = []
    for final in run.finals:
        if final.words:
            sent = sent_at(run, final.words[-1].end)
            if sent is not None:
                delays.append(final.received - sent)
    return delays


def first_partial_delay(run: StreamRun) -> float | None:
    """Time to first partial: the arrival of the first text with words minus the sending of its first word's end."""
    first = next((t for t in run.transcripts if t.words), None)
    sent = None if first is None else sent_at(run, first.words[0].end)
    return None if first is None or sent is None else first.received - sent


# ---------------------------------------------------------------------------------------------------------------------
# Scoring


@dataclass(frozen=True)
class RouteErrors:
    """The streamed errors charged to the finals of one commit route."""

    route: str  # CommitRoute's value, or "none" for missing words with no final to charge
    finals: int
    words: int  # normalised words in those finals
    errors: int  # substitutions and insertions in them, and missing words just after one of their words
    # of those, the ones offline did not make (at a reference word offline got right, or an insertion where offline
    # inserted nothing): what streaming lost
    streaming_only: int = 0

    def __add__(self, other: RouteErrors) -> RouteErrors:
        return RouteErrors(
            self.route,
            self.finals + other.finals,
            self.words + other.words,
            self.errors + other.errors,
            self.streaming_only + other.streaming_only,
        )


def route_errors(reference: str, run: StreamRun, offline: str | None = None) -> tuple[RouteErrors, ...]:
    """Charge each error of ``run``'s finals against ``reference`` (normalised, aligned word by word) to the final it
    falls in: a substituted or inserted word to its own final, a missing word to the final of the word before it (a
    window that lost words at its end lost them there), or the first final when the gap opens the stream. Empty when
    the run's finals carry no route (the wire does not say). Each final is normalised on its own, so a number spoken
    across two finals can count differently from the pooled WER. With ``offline`` (the offline transcript), an error
    at a reference word that offline also got wrong (or an insertion where offline inserted too) is not counted as
    streaming's own."""
    from streamer.offline.normalize import normalize_english, word_edits

    finals = [t for t in run.finals if t.route]
    if not finals:
        return ()
    hyp: list[str] = []
    owner: list[int] = []
    for index, final in enumerate(finals):
        words = normalize_english(final.text).split()
        hyp += words
        owner += [index] * len(words)
    ref = normalize_english(reference).split()
    # the reference words offline got wrong, and where it inserted words
    offline_wrong: set[tuple[str, int]] = set()
    if offline is not None:
        for edit in word_edits(ref, normalize_english(offline).split()):
            offline_wrong.add(("insertion" if edit.kind == "insertion" else "word", edit.ref_index))
    charged = [0] * len(finals)
    own = [0] * len(finals)
    unowned = 0
    for edit in word_edits(ref, hyp):
        position = edit.hyp_index - 1 if edit.kind == "deletion" else edit.hyp_index
        if not owner:
            unowned += 1
            continue
        index = owner[min(max(position, 0), len(owner) - 1)]
        charged[index] += 1
        shared = ("insertion" if edit.kind == "insertion" else "word", edit.ref_index) in offline_wrong
        own[index] += offline is not None and not shared
    by_route: dict[str, RouteErrors] = {}
    for index, final in enumerate(finals):
        here = RouteErrors(final.route, 1, owner.count(index), charged[index], own[index])
        by_route[final.route] = by_route[final.route] + here if final.route in by_route else here
    if unowned:
        by_route["none"] = RouteErrors("none", 0, 0, unowned)
    return tuple(by_route.values())


def _merge_routes(groups: Iterable[Iterable[RouteErrors]]) -> tuple[RouteErrors, ...]:
    merged: dict[str, RouteErrors] = {}
    for group in groups:
        for r in group:
            merged[r.route] = merged[r.route] + r if r.route in merged else r
    return tuple(merged.values())


@dataclass(frozen=True)
class StreamMeasured:
    """Everything measured on one stream of the set (over its concurrent copies) or pooled over several."""

    name: str
    seconds: float  # audio per copy (summed over the streams when pooled)
    copies: int
    streamed: WerResult
    offline: WerResult
    final_delays: tuple[float, ...]  # speaker-measured, seconds
    server_final: tuple[float, ...]  # the server's latency_ms of the same finals, in seconds
    first_partials: tuple[float, ...]
    errors: tuple[str, ...] = ()
    routes: tuple[RouteErrors, ...] = ()  # the accelerated mode's errors by commit route, over every copy

    @property
    def gap(self) -> float:
        """Streamed minus offline WER, in points."""
        return 100 * (self.streamed.wer - self.offline.wer)

    @property
    def final_delay(self) -> Delays:
        return Delays.of(self.final_delays)

    @property
    def server_delay(self) -> Delays:
        return Delays.of(self.server_final)

    @property
    def first_partial(self) -> Delays:
        return Delays.of(self.first_partials)


def measure(stream: EvalStream, runs: Sequence[StreamRun], offline_text: str) -> StreamMeasured:
    """Score the runs (one per concurrent copy) of ``stream`` and its offline transcript."""
    from streamer.offline.normalize import normalize_english, word_error_rate

    reference = normalize_english(stream.reference)
    streamed = word_error_rate([reference] * len(runs), [normalize_english(r.text) for r in runs])
    firsts = [first_partial_delay(r) for r in runs]
    return StreamMeasured(
        name=stream.name,
        seconds=stream.seconds,
        copies=len(runs),
        streamed=streamed,
        offline=word_error_rate([reference], [normalize_english(offline_text)]),
        final_delays=tuple(d for r in runs for d in final_delays(r)),
        server_final=tuple(t.latency_ms / 1000 for r in runs for t in r.finals if t.words),
        first_partials=tuple(f for f in firsts if f is not None),
        errors=tuple(e for r in runs for e in r.errors),
        routes=_merge_routes(route_errors(stream.reference, r, offline_text) for r in runs),
    )


def pool(name: str, measured: Sequence[StreamMeasured]) -> StreamMeasured:
    """The figures of several streams together: WER pooled over words (not averaged), delays over all finals."""
    if not measured:
        raise ValueError("nothing to pool")
    streamed, offline = measured[0].streamed, measured[0].offline
    for m in measured[1:]:
        streamed, offline = streamed + m.streamed, offline + m.offline
    return StreamMeasured(
        name=name,
        seconds=sum(m.seconds for m in measured),
        copies=max(m.copies for m in measured),
        streamed=streamed,
        offline=offline,
        final_delays=tuple(d for m in measured for d in m.final_delays),
        server_final=tuple(d for m in measured for d in m.server_final),
        first_partials=tuple(d for m in measured for d in m.first_partials),
        errors=tuple(e for m in measured for e in m.errors),
        routes=_merge_routes(m.routes for m in measured),
    )


# ---------------------------------------------------------------------------------------------------------------------
# Running


def section_name(copies: int, together: bool, half: str | None = None, workers: int = 1) -> str:
    """The section of docs/benchmarks.md a pass writes: one stream, N staggered and N together each keep their own
    (the issue's targets are one of each), and a run over one half its own, and one with workers its own."""
    name = "accuracy" if copies == 1 else f"accuracy-{copies}-streams-{'together' if together else 'staggered'}"
    name = f"{name}-{half}-half" if half else name
    return f"{name}-{workers}-workers" if workers > 1 else name


def worker_threads(args: argparse.Namespace) -> WorkerThreads:
    """Each worker's threads with ``--workers``, as ``streamer serve --workers`` gives them: ``--threads``, fixed, or
    the cores shared out by load."""
    return threads_of(args.workers, args.threads)


def workers_note(args: argparse.Namespace) -> str:
    """What the report says of a server with workers (nothing for one engine in the bench's process)."""
    if args.workers <= 1:
        return ""
    threads = worker_threads(args)
    engines = (
        f"at {threads.threads} thread(s)"
        if threads.cores is None
        else f"on the {threads.cores} core(s) shared out by load ({threads.threads} thread(s) each while all are busy)"
    )
    return (
        f" The server ran as `streamer serve --workers {args.workers}` does: {args.workers} processes on one port, "
        f"each with its own engine {engines}, taking connections in turn by load; the engine figures "
        "are theirs together (its busy share is summed over them)."
    )


def starts(copies: int, together: bool, step_ms: int) -> list[float]:
    """When each concurrent copy starts (seconds): spread over one step, or all at once."""
    return [0.0 if together else i * step_ms / 1000 / copies for i in range(copies)]


def core_options(args: argparse.Namespace) -> CoreOptions:
    """The core's options with the sweepable fields of ``args`` (each defaults to CoreOptions' own); validated."""
    from streamer.cli.serve import core_options_from

    core = core_options_from(args)  # step, end point and the commit policy, as streamer serve takes them
    options = replace(
        core,
        agreement_n=args.agreement_n,
        prompt_max_chars=args.prompt_max_chars,
        trim_after_ms=args.trim_after_ms,
        trim_context_ms=args.trim_context_ms,
        vad=replace(core.vad, pad_before_ms=args.pad_before_ms, pad_after_ms=args.pad_after_ms),
        guards=replace(core.guards, no_speech_threshold=args.no_speech_threshold),
    )
    options.validate()
    return options


def _script(timeline: FakeTimeline, stream: EvalStream) -> None:
    """The scripted engine says the stream's reference, spread over its utterances."""
    timeline.words = FakeTimeline.words_for(
        BenchFile(Path(stream.name), stream.samples, stream.reference, stream.utterances)
    )


def _accelerated(
    engine: RecordingEngine, stream: EvalStream, core: CoreOptions, args: argparse.Namespace, together: bool
) -> list[StreamRun]:
    from streamer.bench.simulate import SimulatedStream, simulate

    copies = [
        SimulatedStream(f"{stream.name} #{i}", stream.samples, t)
        for i, t in enumerate(starts(args.streams, together, args.step_ms))
    ]
    sim = simulate(engine, copies, core, bench_scheduler(args), args.chunk_ms)
    return list(sim.runs)


async def _realtime(
    engine: RecordingEngine, stream: EvalStream, core: CoreOptions, args: argparse.Namespace, together: bool
) -> list[StreamRun]:
    copies = tuple(
        ClientStream(f"{stream.name} #{i}", stream.samples, t)
        for i, t in enumerate(starts(args.streams, together, args.step_ms))
    )
    if args.workers > 1:
        from streamer.bench.workers import WorkerSpec, worker_pool

        spec = WorkerSpec(bench_config(args, args.streams, core), args.model, args.config, worker_threads(args))
        with worker_pool(spec, args.workers, engine) as pool:
            share = ClientShare(f"ws://127.0.0.1:{pool.port}", copies, 1.0, args.chunk_ms)
            result = await stream_clients(share, args.clients)
    else:
        async with serve(engine, args, max_sessions=args.streams, core=core) as server:
            share = ClientShare(f"ws://127.0.0.1:{server.port}", copies, 1.0, args.chunk_ms)
            result = await stream_clients(share, args.clients)
    if result.failed:
        raise StreamerError(f"{len(result.failed)} stream(s) failed: {result.failed[0]}")
    return list(result.runs)


@dataclass(frozen=True)
class Pass:
    """One pass over the set in one mode: the figures per stream and pooled, and what it cost."""

    mode: str
    copies: int
    together: bool
    streams: tuple[StreamMeasured, ...]
    groups: tuple[StreamMeasured, ...]  # per group and half
    halves: tuple[StreamMeasured, ...]  # per half, named as in HALVES
    pooled: StreamMeasured
    wall_seconds: float  # streaming only (offline transcription excluded)
    texts: tuple[tuple[str, str], ...]  # (stream, streamed text of copy 0)
    engine_work: EngineWork  # what the engine spent on the pass

    @property
    def judged(self) -> StreamMeasured:
        """What the targets are judged on: the report half pooled, or everything when the run has none."""
        return next((h for h in self.halves if h.name == "report"), self.pooled)

    @property
    def label(self) -> str:
        starts_ = "" if self.copies == 1 else (", starts together" if self.together else ", starts staggered")
        return f"{self.mode}, {self.copies} stream{'s' if self.copies > 1 else ''}{starts_}"


def _pass(
    engine: RecordingEngine,
    timeline: FakeTimeline,
    streams: Sequence[EvalStream],
    offline: dict[str, str],
    args: argparse.Namespace,
    mode: str,
    together: bool,
) -> Pass:
    core = core_options(args)
    measured, texts = [], []
    engine.take()  # the pass's windows only
    started = time.perf_counter()
    for stream in streams:
        _script(timeline, stream)
        print(f"{mode}: {stream.name} ({stream.seconds:.0f} s, {args.streams} stream(s))", file=sys.stderr)
        if mode == "accelerated":
            runs = _accelerated(engine, stream, core, args, together)
        else:
            runs = asyncio.run(_realtime(engine, stream, core, args, together))
        measured.append(measure(stream, runs, offline[stream.name]))
        texts.append((stream.name, runs[0].text))
    wall = time.perf_counter() - started
    pairs = list(zip(measured, streams, strict=True))
    groups = [
        pool(f"{g}, {h}", [m for m, s in pairs if s.group == g and s.half == h])
        for h in HALVES
        for g in GROUPS
        if any(s.group == g and s.half == h for s in streams)
    ]
    halves = [pool(h, [m for m, s in pairs if s.half == h]) for h in HALVES if any(s.half == h for s in streams)]
    return Pass(
        mode,
        args.streams,
        together,
        tuple(measured),
        tuple(groups),
        tuple(halves),
        pool("all", measured),
        wall,
        tuple(texts),
        EngineWork.of(engine.take()),
    )


def _offline(engine: RecordingEngine, timeline: FakeTimeline, streams: Sequence[EvalStream]) -> dict[str, str]:
    from streamer.offline.transcribe import transcribe

    texts = {}
    for stream in streams:
        _script(timeline, stream)
        print(f"offline: {stream.name}", file=sys.stderr)
        texts[stream.name] = transcribe(engine, stream.samples).text
    return texts


def _warm_up(engine: RecordingEngine, timeline: FakeTimeline, stream: EvalStream, core: CoreOptions) -> None:
    """Decode two streaming windows before measuring: the first decodes with word timings in a process take seconds
    longer (lazy initialisation), and would be charged to whichever mode runs first."""
    from streamer.engine.types import DecodeRequest

    _script(timeline, stream)
    for seconds in (1, 5):
        engine.decode([DecodeRequest(audio=stream.samples[: seconds * SAMPLE_RATE], options=core.decode)])
    engine.take()


# ---------------------------------------------------------------------------------------------------------------------
# Reporting


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(m: StreamMeasured) -> list[str]:
    d, f = m.final_delay, m.first_partial
    return [
        m.name,
        f"{m.seconds:.0f}",
        f"{100 * m.streamed.wer:.2f}",
        f"{100 * m.offline.wer:.2f}",
        f"{m.gap:+.2f}",
        *(_s(v) for v in (d.p50, d.p90, d.p95, d.max)),
        _s(f.p50),
        _s(m.server_delay.p95),
    ]


_HEADER = [
    "stream",
    "audio s",
    "streamed WER %",
    "offline WER %",
    "gap",
    "final delay p50 s",
    "p90",
    "p95",
    "max",
    "first partial p50 s",
    "server latency p95 s",
]


def verdicts(result: Pass, targets: AccuracyTargets = TARGETS) -> list[tuple[str, bool | None, str]]:
    """(target, met, what was measured) for the targets of issues 16 and 39 that this pass measures, on
    :attr:`Pass.judged`."""
    p = result.judged
    out: list[tuple[str, bool | None, str]] = [
        (
            f"streamed WER <= offline + {targets.wer_gap_points:g} points",
            p.gap <= targets.wer_gap_points,
            f"{p.gap:+.2f} points",
        ),
    ]
    limit = (
        targets.final_p95_one
        if result.copies == 1
        else targets.final_p95_together
        if result.together
        else targets.final_p95_staggered
    )
    p95 = p.final_delay.p95
    out.append((f"final delay p95 <= {limit:g} s ({result.label})", None if p95 is None else p95 <= limit, _s(p95)))
    f50 = p.first_partial.p50
    out.append(
        (
            f"first partial p50 <= {targets.first_partial_p50:g} s",
            None if f50 is None else f50 <= targets.first_partial_p50,
            _s(f50),
        )
    )
    return out


def format_pass(result: Pass, audio_seconds: float, halves: dict[str, str] | None = None) -> str:
    """The pass's table (``halves``: each stream's half, shown beside its name) and its verdicts."""
    halves = halves or {}
    rows = [
        _row(replace(m, name=f"{m.name} ({halves[m.name]})" if m.name in halves else m.name)) for m in result.streams
    ]
    rows += [
        _row(replace(m, name=f"**{m.name}** (pooled)"))
        for m in (*result.groups, *result.halves, *([result.pooled] if len(result.halves) > 1 else []))
    ]
    speed = audio_seconds * result.copies / result.wall_seconds if result.wall_seconds else 0.0
    judged = "the report half" if result.judged is not result.pooled else "the run"
    lines = [
        f"{result.label}: {len(result.streams)} streams, {audio_seconds:.0f} s of audio per copy; streaming took "
        f"{result.wall_seconds:.0f} s ({speed:.1f} s of audio per second). "
        + result.engine_work.describe(result.wall_seconds),
        "",
        format_table(_HEADER, rows),
        "",
        f"Targets (issues 16 and 39), pooled over {judged}:",
        "",
    ]
    for target, met, measured in verdicts(result):
        lines.append(f"- {target}: {measured}, {'not measured' if met is None else 'met' if met else 'MISSED'}")
    lines += _route_lines(result)
    errors = result.pooled.errors
    if errors:
        lines += ["", f"{len(errors)} error(s): " + "; ".join(errors[:5])]
    return "\n".join(lines)


def _route_lines(result: Pass) -> list[str]:
    """The errors by commit route, per half and pooled (the accelerated mode only)."""
    rows = []
    for m in (*result.halves, result.pooled):
        words = sum(r.words for r in m.routes) or 1
        for r in sorted(m.routes, key=lambda r: r.route):
            rows.append(
                [
                    m.name,
                    r.route,
                    str(r.finals),
                    f"{r.words} ({100 * r.words / words:.0f} %)",
                    str(r.errors),
                    f"{100 * r.errors / max(1, r.words):.2f}",
                    str(r.streaming_only),
                    f"{100 * r.streaming_only / max(1, r.words):.2f}",
                ]
            )
    if not rows:
        return []
    header = [
        "pooled over",
        "commit route",
        "finals",
        "words",
        "errors charged",
        "per 100 words",
        "offline right there",
        "per 100 words",
    ]
    return [
        "",
        "Errors by commit route (the core's events; an error is charged to the final it falls in, a missing word to "
        "the final before the gap; 'offline right there': the errors at reference words offline transcribed right, "
        "what streaming lost):",
        "",
        format_table(header, rows),
    ]


def format_validation(pairs: Sequence[tuple[Pass, Pass]], tolerance: Tolerance = TOLERANCE) -> str:
    """Accelerated against real time, pooled, per configuration, with a verdict per figure."""
    rows = []
    for fast, real in pairs:
        a, r = fast.judged, real.judged
        checks: list[tuple[str, float | None, float | None, bool | None]] = [
            (
                "streamed WER %",
                100 * a.streamed.wer,
                100 * r.streamed.wer,
                abs(a.streamed.wer - r.streamed.wer) * 100 <= tolerance.wer_points,
            ),
        ]
        for name, da, dr in (
            ("final delay", a.final_delay, r.final_delay),
            ("first partial", a.first_partial, r.first_partial),
        ):
            for q in ("p50", "p90", "p95", "max"):
                va, vr = getattr(da, q), getattr(dr, q)
                ok = None if q == "max" else tolerance.delay_ok(va, vr)  # a maximum is one sample: shown, not judged
                checks.append((f"{name} {q} s", va, vr, ok))
        checks.append(("server latency p95 s", a.server_delay.p95, r.server_delay.p95, None))
        for name, va, vr, ok in checks:
            verdict = "-" if ok is None else "within" if ok else "OUTSIDE"
            rows.append([real.label.replace("realtime, ", ""), name, _s(va), _s(vr), verdict])
        rows.append(
            [
                real.label.replace("realtime, ", ""),
                "wall s",
                f"{fast.wall_seconds:.0f}",
                f"{real.wall_seconds:.0f}",
                "-",
            ]
        )
    return "\n".join(
        [
            "Judged on the report half when the run has one. "
            f"Tolerance: pooled streamed WER within {tolerance.wer_points:g} point; each delay percentile within "
            f"{tolerance.delay_seconds:g} s or {100 * tolerance.delay_fraction:.0f}% of the real-time figure, "
            "whichever is larger (the maximum, one sample, is shown but not judged).",
            "",
            format_table(["configuration", "figure", "accelerated", "real time", "verdict"], rows),
        ]
    )


# ---------------------------------------------------------------------------------------------------------------------
# Command line


def configure_parser(parser: argparse.ArgumentParser) -> None:
    core = CoreOptions()
    parser.add_argument(
        "--mode",
        choices=["accelerated", "realtime"],
        default="accelerated",
        help="simulated clock with real decode times, or real time through a server (default: %(default)s)",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="run both modes (1 stream; N staggered and N together with --streams N) side by side",
    )
    parser.add_argument("--streams", type=int, default=1, help="concurrent copies of each stream (default: 1)")
    parser.add_argument("--together", action="store_true", help="copies start at once, not staggered over a step")
    add_clients_argument(parser, "realtime mode: ")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="realtime mode: the server as streamer serve --workers N runs it, N engine processes on its port, each "
        "with --threads (default: the cores shared out); 1: one engine in the bench's process (default: 1)",
    )
    parser.add_argument("--group", action="append", choices=GROUPS, help="only these groups (repeatable)")
    parser.add_argument("--only", action="append", default=[], help="only streams whose name contains this")
    parser.add_argument(
        "--half",
        choices=HALVES,
        default=None,
        help="only the speakers of this half (default: both; the targets are judged on the report half)",
    )
    parser.add_argument("--agreement-n", type=int, default=core.agreement_n, help="LocalAgreement-n")
    parser.add_argument("--pad-before-ms", type=int, default=core.vad.pad_before_ms, help="VAD padding before speech")
    parser.add_argument("--pad-after-ms", type=int, default=core.vad.pad_after_ms, help="VAD padding after speech")
    parser.add_argument("--prompt-max-chars", type=int, default=core.prompt_max_chars, help="committed text prompt")
    parser.add_argument("--trim-after-ms", type=int, default=core.trim_after_ms, help="window trim point")
    parser.add_argument(
        "--trim-context-ms",
        type=int,
        default=core.trim_context_ms,
        help="context a window trimmed mid-sentence keeps before the commit point",
    )
    parser.add_argument(
        "--no-speech-threshold",
        type=float,
        default=core.guards.no_speech_threshold,
        help="a result is silence above this no-speech probability (with a low log-probability)",
    )
    parser.add_argument("--max-batch-size", type=int, default=None, help="windows per engine call (server default)")
    from streamer.cli.serve import add_opening_arguments

    add_opening_arguments(parser)
    add_engine_arguments(parser)
    add_stream_arguments(parser)
    add_docs_argument(parser)


def run(args: argparse.Namespace) -> int:
    check_stream_arguments(args)
    if args.speed != 1.0:
        raise ConfigError("bench accuracy streams at real time (--speed 1): the delays are the speaker's")
    if args.streams < 1:
        raise ConfigError("--streams must be >= 1")
    if args.workers < 1:
        raise ConfigError("--workers must be >= 1")
    if args.workers > 1 and (args.mode != "realtime" or args.validate or args.engine != "real"):
        raise ConfigError("--workers is for --mode realtime with the model: the workers are processes of their own")
    core_options(args)  # refuse bad options before loading anything
    machine = machine_note()
    started = time.perf_counter()
    streams = build_set(args.group or GROUPS, only=args.only, half=args.half)
    halves = {s.name: s.half for s in streams}
    audio = sum(s.seconds for s in streams)
    timeline = FakeTimeline()
    engine = make_engine(args, timeline)
    try:
        offline = _offline(engine, timeline, streams)
        _warm_up(engine, timeline, streams[0], core_options(args))
        if args.validate:
            configs = [(1, False)] + ([(args.streams, False), (args.streams, True)] if args.streams > 1 else [])
            pairs = []
            for copies, together in configs:
                one = argparse.Namespace(**{**vars(args), "streams": copies})
                pairs.append(
                    tuple(
                        _pass(engine, timeline, streams, offline, one, mode, together)
                        for mode in ("accelerated", "realtime")
                    )
                )
        else:
            result = _pass(engine, timeline, streams, offline, args, args.mode, args.together)
    finally:
        engine.close()
    total = time.perf_counter() - started
    if args.validate:
        validated = [(a, b) for a, b in pairs]
        body = "\n".join(
            [
                f"Streams: {', '.join(s.name for s in streams)} ({audio:.0f} s). The whole run took {total:.0f} s.",
                "",
                format_validation(validated),
            ]
        )
        name = "accuracy-validation"
        figures = {
            "machine": machine,
            "engine": engine.info,
            "tolerance": TOLERANCE,
            "total_seconds": total,
            "passes": [p for pair in validated for p in pair],
        }
    else:
        body = (
            format_pass(result, audio, halves)
            + f"\n\nThe whole run (offline transcription included) took {total:.0f} s."
            + workers_note(args)
        )
        name = section_name(args.streams, args.together, args.half, args.workers)
        figures = {
            "machine": machine,
            "engine": engine.info,
            "targets": TARGETS,
            "total_seconds": total,
            "pass": result,
            "offline": offline,
            "verdicts": [{"target": t, "met": m, "measured": v} for t, m, v in verdicts(result)],
        }
    print(body)
    print(
        f"wrote {write_report(Report(name, command_line('accuracy', args), body, figures), args.docs)}", file=sys.stderr
    )
    return 0
