"""``streamer bench scheduling``: what letting closing windows go first buys, side by side in one run.

Once the engine is saturated a window waits for the batches ahead of it. The scheduler lets windows that close an
utterance (their final is waiting on them) go first (:attr:`~streamer.server.scheduler.SchedulerOptions.finals_first`);
strict rotation is the alternative. This benchmark streams ``--streams`` real-time streams of the same long-form
audio against one in-process server and engine, once per policy per round, the policies taking turns (which one
goes first alternates between rounds), and prints final and partial latency under each, with the ratio of their
final p95 -- the figure the capacity target is judged on (``streamer bench capacity``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from streamer.bench.capacity import CapacityStep, add_load_arguments, check_load_arguments, judge, measure_step
from streamer.bench.harness import FakeTimeline, load_bench_file, make_engine
from streamer.bench.report import Report, command_line, format_table, machine_note, write_report
from streamer.core.errors import ConfigError

__all__ = ["POLICIES", "PolicyRun", "configure_parser", "format_runs", "run", "summary"]

# policy name -> SchedulerOptions.finals_first
POLICIES: dict[str, bool] = {"finals first": True, "round robin": False}


@dataclass(frozen=True)
class PolicyRun:
    """One round of one policy."""

    policy: str
    round: int
    step: CapacityStep


def summary(runs: Sequence[PolicyRun], policy: str) -> tuple[float | None, float | None]:
    """Mean over the rounds of ``policy``'s final latency p50 and p95 (ms)."""
    steps = [r.step for r in runs if r.policy == policy]
    p50 = [s.final_ms.p50 for s in steps if s.final_ms.p50 is not None]
    p95 = [s.final_ms.p95 for s in steps if s.final_ms.p95 is not None]
    return (statistics.fmean(p50) if p50 else None, statistics.fmean(p95) if p95 else None)


def format_runs(runs: Sequence[PolicyRun], args: argparse.Namespace) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    rows = [
        [
            r.policy,
            str(r.round),
            ms(r.step.final_ms.p50),
            ms(r.step.final_ms.p95),
            ms(r.step.final_ms.max),
            ms(r.step.partial_ms.p50),
            ms(r.step.partial_ms.p95),
            "-" if r.step.lag_growth_s is None else f"{r.step.lag_growth_s:+.2f}",
            f"{100 * r.step.engine_busy:.0f}%",
            "held" if r.step.held else "FAILED: " + "; ".join(r.step.failures),
        ]
        for r in runs
    ]
    header = [
        "policy",
        "round",
        "final p50 ms",
        "final p95 ms",
        "final max ms",
        "partial p50 ms",
        "partial p95 ms",
        "lag growth s",
        "engine busy",
        "verdict",
    ]
    first, robin = summary(runs, "finals first"), summary(runs, "round robin")
    lines = [
        f"{args.streams} real-time streams of {args.duration:g} s, {args.rounds} round(s), the policies taking turns "
        f"(one in-process server and engine); limits as in `streamer bench capacity`: final p95 <= "
        f"{args.limit_ms:.0f} ms, lag growth <= {args.max_lag_growth:g} s, no audio lost.",
        "",
        format_table(header, rows),
        "",
    ]
    if first[1] and robin[1]:
        lines.append(
            f"Final latency, mean over rounds: finals first p50 {ms(first[0])} / p95 {ms(first[1])} ms, round robin "
            f"p50 {ms(robin[0])} / p95 {ms(robin[1])} ms: round robin's final p95 is {robin[1] / first[1]:.2f}x "
            "that of finals first."
        )
    return "\n".join(lines)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=int, default=8, help="concurrent real-time streams (default: 8)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each policy (default: 2)")
    add_load_arguments(parser)


def check_arguments(args: argparse.Namespace) -> None:
    for name, value in (("--streams", args.streams), ("--rounds", args.rounds)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1")
    check_load_arguments(args)


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    machine = machine_note()
    file = load_bench_file(args.file)
    engine = make_engine(args, FakeTimeline(FakeTimeline.words_for(file)))
    runs: list[PolicyRun] = []
    try:
        for number in range(1, args.rounds + 1):
            order = list(POLICIES) if number % 2 else list(reversed(POLICIES))
            for policy in order:
                print(f"round {number}: {policy}, {args.streams} stream(s) of {args.duration:g} s ...", file=sys.stderr)
                policy_args = argparse.Namespace(**{**vars(args), "finals_first": POLICIES[policy]})
                step = asyncio.run(measure_step(engine, file.samples, args.streams, policy_args))
                runs.append(PolicyRun(policy, number, judge(step, args.limit_ms, args.max_lag_growth)))
    finally:
        engine.close()
    body = format_runs(runs, args)
    print(body)
    first, robin = summary(runs, "finals first"), summary(runs, "round robin")
    figures = {
        "machine": machine,
        "engine": engine.info,
        "file": str(args.file),
        "runs": [{"policy": r.policy, "round": r.round, **r.step.__dict__, "held": r.step.held} for r in runs],
        "final_p95_ms": {"finals first": first[1], "round robin": robin[1]},
    }
    report = Report("scheduling", command_line("scheduling", args), body, figures, ())
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
