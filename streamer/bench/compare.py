"""``streamer bench compare``: the server benchmarks on two commits (HEAD and an earlier one), side by side.

A change to the server's edge (the front door of issue 14, say) must not cost the speaker latency, capacity or
memory. Figures recorded weeks apart on a shared machine cannot show that, so this command checks both commits
out into temporary git worktrees and runs the same benchmarks (``stream``, ``capacity``, ``soak``) on both,
interleaved round by round (baseline first in odd rounds, this tree first in even ones, so neither always
runs on a warmer or quieter machine). It prints each figure's mean per side and the ratio this tree / baseline, with
a verdict per figure against a tolerance for noise (:data:`CHECKS`).

Each run is a fresh process (``python -m streamer bench NAME ... --docs TMP``) whose JSON figures are read back; the
repository's own docs are written only with the comparison itself.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamer.bench.report import REPO, Report, add_docs_argument, command_line, format_table, machine_note

__all__ = ["BENCHES", "CHECKS", "Check", "Side", "compare", "configure_parser", "figures_of", "run"]

# each benchmark as the comparison runs it: short enough for two sides and two rounds in well under an hour
BENCHES: dict[str, tuple[str, ...]] = {
    "stream": (),
    "capacity": ("--max-streams", "8", "--duration", "30"),
    "soak": ("--streams", "4", "--minutes", "2", "--limit-mb", "2000"),
}


@dataclass(frozen=True)
class Check:
    """A figure of one benchmark and what counts as no regression for it."""

    bench: str
    figure: str  # the name printed
    path: tuple[str, ...]  # where it is in the benchmark's JSON
    # no regression: current <= baseline * ratio + slack (higher is worse), or current >= baseline * ratio - slack
    higher_is_better: bool = False
    ratio: float = 1.0
    slack: float = 0.0

    def holds(self, baseline: float, current: float) -> bool:
        if self.higher_is_better:
            return current >= baseline * self.ratio - self.slack
        return current <= baseline * self.ratio + self.slack


# The tolerances are noise, measured: on this 2-core machine two runs of one tree differ by up to ~10% in latency
# percentiles and by a few tens of MB in RSS; WER is deterministic to a few words on the same audio.
CHECKS = (
    Check("stream", "final p50 ms", ("figures", "final_ms", "p50"), ratio=1.15, slack=50),
    Check("stream", "final p95 ms", ("figures", "final_ms", "p95"), ratio=1.15, slack=50),
    Check("stream", "partial p95 ms", ("figures", "partial_ms", "p95"), ratio=1.15, slack=50),
    Check(
        "stream",
        "streamed WER %",
        (
            "figures",
            "streamed_wer",
        ),
        slack=0.5,
    ),
    Check(
        "stream",
        "lost s",
        (
            "figures",
            "lost_seconds",
        ),
    ),
    Check("capacity", "streams held", ("largest_held",), higher_is_better=True),
    Check("capacity", "final p95 ms at the last step", ("steps", "-1", "final_ms", "p95"), ratio=1.15, slack=50),
    Check("soak", "peak RSS MB", ("figures", "hwm_mb"), ratio=1.10),
    Check("soak", "final p95 ms", ("figures", "final_ms", "p95"), ratio=1.15, slack=50),
    Check(
        "soak",
        "lost s",
        (
            "figures",
            "lost_seconds",
        ),
    ),
)


def figures_of(bench: str, document: Mapping[str, Any]) -> dict[str, float]:
    """The figures :data:`CHECKS` compare, read from one run's JSON (``docs/benchmarks/NAME.json``)."""
    out: dict[str, float] = {}
    for check in CHECKS:
        if check.bench != bench:
            continue
        value: Any = document
        for key in check.path:
            value = value[int(key)] if isinstance(value, list) else value[key]
        out[check.figure] = float(value)
    return out


@dataclass(frozen=True)
class Side:
    """One tree the benchmarks run on."""

    name: str  # "baseline" or "this tree"
    root: Path  # the repository checkout to run from


Runner = Callable[[Side, str, Sequence[str], Path], Mapping[str, Any]]


def run_bench(side: Side, bench: str, extra: Sequence[str], docs: Path) -> Mapping[str, Any]:
    """Run ``streamer bench BENCH`` from ``side``'s tree in a fresh process; its JSON figures."""
    import json

    env = {**os.environ, "PYTHONPATH": str(side.root)}
    command = [sys.executable, "-m", "streamer", "bench", bench, *BENCHES[bench], *extra, "--docs", str(docs)]
    print(f"[{side.name}] {shlex.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=side.root, env=env, check=True, stdout=subprocess.DEVNULL)
    result: Mapping[str, Any] = json.loads((docs / "benchmarks" / f"{bench}.json").read_text())
    return result


def compare(
    sides: tuple[Side, Side], benches: Sequence[str], rounds: int, work: Path, runner: Runner = run_bench
) -> dict[str, dict[str, list[dict[str, float]]]]:
    """Every benchmark on both sides, ``rounds`` times, interleaved; figures[bench][side name] = one dict per round."""
    results: dict[str, dict[str, list[dict[str, float]]]] = {b: {s.name: [] for s in sides} for b in benches}
    for round_ in range(rounds):
        order = sides if round_ % 2 == 0 else sides[::-1]
        for bench in benches:
            for side in order:
                docs = work / f"{bench}-{side.name.replace(' ', '-')}-{round_}"
                results[bench][side.name].append(figures_of(bench, runner(side, bench, (), docs)))
    return results


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def verdicts(results: Mapping[str, Mapping[str, Sequence[Mapping[str, float]]]]) -> list[dict[str, Any]]:
    """One row per checked figure: the mean per side, the ratio, and whether it holds."""
    rows = []
    for check in CHECKS:
        if check.bench not in results:
            continue
        base = _mean([r[check.figure] for r in results[check.bench]["baseline"]])
        current = _mean([r[check.figure] for r in results[check.bench]["this tree"]])
        ratio = current / base if base else (1.0 if current == 0 else float("inf"))
        rows.append(
            {
                "bench": check.bench,
                "figure": check.figure,
                "baseline": round(base, 2),
                "this_tree": round(current, 2),
                "ratio": round(ratio, 3),
                "no_regression": check.holds(base, current),
            }
        )
    return rows


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", required=True, help="the commit to compare against")
    parser.add_argument("--current", default="HEAD", help="the commit compared (default: HEAD)")
    parser.add_argument(
        "--bench", action="append", choices=sorted(BENCHES), help="repeatable (default: stream, capacity, soak)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs per side, interleaved (default: 2)")
    add_docs_argument(parser)


def _short(rev: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", rev], capture_output=True, text=True, check=True
    ).stdout.strip()


def run(args: argparse.Namespace) -> int:
    benches = args.bench or list(BENCHES)
    commit, current = _short(args.baseline), _short(args.current)
    with tempfile.TemporaryDirectory(prefix="streamer-compare-") as tmp:
        work = Path(tmp)
        roots = []
        # both sides are clean checkouts of their commits (the working tree may change while this runs), and their
        # benches find the shared data as ../shared/data from their checkout, as the repository's do
        for name, rev in (("base", commit), ("current", current)):
            (work / name).mkdir()
            shared = REPO.parent / "shared"
            if shared.exists():
                (work / name / "shared").symlink_to(shared)
            root = work / name / "main"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(root), rev], check=True)
            roots.append(root)
        try:
            sides = (Side("baseline", roots[0]), Side("this tree", roots[1]))
            results = compare(sides, benches, args.rounds, work)
        finally:
            for root in roots:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(root)], check=False)
                shutil.rmtree(root, ignore_errors=True)
    rows = verdicts(results)
    table = format_table(
        ["bench", "figure", f"baseline {commit}", f"this tree {current}", "ratio", "no regression"],
        [[str(r[k]) for k in ("bench", "figure", "baseline", "this_tree", "ratio")]
         + ["yes" if r["no_regression"] else "NO"] for r in rows],
    )  # fmt: skip
    held = all(r["no_regression"] for r in rows)
    body = (
        f"Each benchmark on commit {commit} (baseline) and on {current} (this tree), {args.rounds} rounds"
        " interleaved, means per side; ratio = this tree / baseline. Benchmarks as run: "
        + "; ".join(f"`{shlex.join(['streamer', 'bench', b, *BENCHES[b]])}`" for b in benches)
        + f". Latency is the server's share (`latency_ms`). Verdict: {'no regression' if held else 'REGRESSION'}.\n\n"
        + table
    )
    report = Report(
        "compare",
        command_line("compare", args),
        body,
        {"machine": machine_note(), "baseline": commit, "current": current, "rounds": results, "verdicts": rows},
    )
    from streamer.bench.report import write_report

    print(table)
    print(f"written to {write_report(report, args.docs)}")
    return 0 if held else 1
