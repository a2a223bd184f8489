"""What every benchmark writes: latency distributions, the ``docs/benchmarks.md`` section, the JSON figures and the
PNG plots.

Each benchmark owns one section of ``docs/benchmarks.md``, between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->``; a rerun replaces its own section in place and leaves the others alone. The section
names the command that produced it and the date, because figures measured on a shared machine mean nothing
without them. The JSON file beside it (``docs/benchmarks/NAME.json``) holds every figure in the section.

matplotlib is optional (``pip install 'streamer[bench]'``): without it the plots are skipped with a message and
everything else is still written.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

from streamer.server.metrics import percentile

__all__ = [
    "DOCS",
    "MATPLOTLIB_HINT",
    "Distribution",
    "Report",
    "add_docs_argument",
    "command_line",
    "format_table",
    "machine_note",
    "plot_cdfs",
    "plot_curve",
    "pyplot",
    "replace_section",
    "repo_relative",
    "save_plot",
    "write_report",
]

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
MATPLOTLIB_HINT = "PNG plots need matplotlib: pip install 'streamer[bench]'"

# argparse destinations that are not options of the benchmark itself
# not the bench's options: the command's words, where the report goes, and the raw command line that the CLI keeps
# for the commands that start copies of themselves (cli/main.py)
_NOT_OPTIONS = ("command", "benchmark", "verbose", "docs", "emit_json", "argv")


@dataclass(frozen=True)
class Distribution:
    """Summary of a sample of values (milliseconds, counts...); every statistic is None for an empty sample."""

    count: int
    p50: float | None
    p95: float | None
    max: float | None
    mean: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        data = list(values)
        if not data:
            return cls(0, None, None, None, None)
        return cls(len(data), percentile(data, 50), percentile(data, 95), max(data), sum(data) / len(data))

    def format(self, unit: str = "", digits: int = 0) -> str:
        """``p50 X / p95 Y / max Z unit (n N)``, or ``none`` for an empty sample."""
        if self.count == 0:
            return "none"

        def f(value: float | None) -> str:
            return "-" if value is None else f"{value:.{digits}f}"

        suffix = f" {unit}" if unit else ""
        return f"p50 {f(self.p50)} / p95 {f(self.p95)} / max {f(self.max)}{suffix} (n {self.count})"


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table whose columns line up in a terminal too (first column left-aligned, the rest right)."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i else ("-" * (w + 2)) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def add_docs_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--docs", type=Path, default=DOCS, help="write benchmarks.md and benchmarks/ here (default: the repo's docs)"
    )


def repo_relative(text: str, repo: Path = REPO) -> str:
    """``text`` with every absolute path inside the repository or beside it (``../shared/data``) made relative to
    the repository, as committed docs must be: the same figures read the same on every checkout."""
    root = str(repo.resolve())
    return text.replace(root + "/", "").replace(str(Path(root).parent) + "/", "../")


def command_line(name: str, args: argparse.Namespace) -> str:
    """The full command that reproduces this run: ``streamer bench NAME`` and every option with its value."""
    words = ["streamer", "bench", name]
    for key, value in vars(args).items():
        if key in _NOT_OPTIONS or value is None or value is False:
            continue
        option = "--" + key.replace("_", "-")
        if value is True:
            words.append(option)
        elif isinstance(value, list | tuple):
            for item in value:
                words += [option, str(item)]
        else:
            words += [option, str(value)]
    return " ".join(shlex.quote(repo_relative(w)) for w in words)


def machine_note() -> str:
    """The CPU (model, the ISA features that pick kernels, the kernel class the engine runs in, torch and oneDNN
    versions), cores and load average at the time of the run: the context every timing on a shared machine needs."""
    from streamer.engine.kernels import kernel_report

    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:  # not available on this platform
        load = "unknown"
    cpu = kernel_report().describe()
    return f"{cpu}; {os.cpu_count()} cores, load average {load} before the run; {_source_note()}"


def _source_note() -> str:
    """The commit measured, and which package files differed from it (others edit the tree while benchmarks run)."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--", "streamer"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "source commit unknown"
    changed = [line[3:] for line in status]
    return f"commit {commit}" + (f" with uncommitted changes to {', '.join(changed)}" if changed else "")


@dataclass(frozen=True)
class Report:
    """One benchmark's results, ready to be written."""

    # section name in benchmarks.md and stem of its files: stream, capacity, quant
    name: str
    # the command that produced it (see command_line)
    command: str
    # Markdown body of the section: tables, verdicts, notes
    body: str
    # every figure, for docs/benchmarks/NAME.json
    figures: Mapping[str, Any]
    # plot file names (inside docs/benchmarks/) that were written, shown under the body
    plots: tuple[str, ...] = ()


def replace_section(document: str, name: str, section: str) -> str:
    """``document`` with the section ``name`` (between its markers) replaced by ``section``, or appended."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{section.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(document):
        return pattern.sub(lambda _: block, document, count=1)
    return document.rstrip() + ("\n\n" if document.strip() else "") + block + "\n"


_PREAMBLE = """# Benchmarks

Written by `streamer bench`; each section is replaced when its benchmark is run again. Timings come from shared
machines and are noisy: compare figures within one section (measured side by side in one run), not across
sections or dates. The figures of each section are also in `benchmarks/NAME.json`.
"""


def write_report(report: Report, docs: Path = DOCS, *, when: datetime.datetime | None = None) -> Path:
    """Write ``report``'s JSON beside ``docs/benchmarks.md`` and replace its section there; returns the .md path.

    Call after the plots (their names are in ``report.plots``) were written into ``docs/benchmarks/``.
    """
    when = when or datetime.datetime.now().astimezone()
    folder = docs / "benchmarks"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = when.strftime("%Y-%m-%d %H:%M %Z").strip()
    figures = {"benchmark": report.name, "command": report.command, "date": when.isoformat(), **report.figures}
    json_path = folder / f"{report.name}.json"
    json_path.write_text(repo_relative(json.dumps(_jsonable(figures), indent=2)) + "\n", encoding="utf-8")
    lines = [
        f"## {report.name}",
        "",
        f"`{report.command}`",
        "",
        f"Run {stamp}; {figures.get('machine', machine_note())}. Figures: [benchmarks/{json_path.name}]"
        f"(benchmarks/{json_path.name}).",
        "",
        report.body.strip(),
    ]
    lines += [f"\n![{plot}](benchmarks/{plot})" for plot in report.plots]
    markdown = docs / "benchmarks.md"
    document = markdown.read_text(encoding="utf-8") if markdown.exists() else _PREAMBLE
    markdown.write_text(replace_section(document, report.name, repo_relative("\n".join(lines))), encoding="utf-8")
    return markdown


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _jsonable({f.name: getattr(value, f.name) for f in fields(value)})
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, float):
        return round(value, 4)
    return value


def pyplot() -> Any | None:
    """matplotlib's pyplot on the file-only Agg backend, or None (with the install hint on stderr) without it."""
    try:
        import matplotlib
    except ImportError:
        print(f"streamer: {MATPLOTLIB_HINT}; plots skipped", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_cdfs(path: Path, title: str, series: Mapping[str, Sequence[float]], limit_ms: float | None) -> bool:
    """Empirical CDFs of latencies (ms), one line per series, with the target as a dashed line; False if not drawn."""
    plt = pyplot()
    if plt is None:
        return False
    figure, axes = plt.subplots(figsize=(7, 4))
    for label, values in series.items():
        ordered = sorted(values)
        if ordered:
            axes.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", label=label)
    if limit_ms is not None:
        axes.axvline(limit_ms, linestyle="--", color="grey", label=f"target {limit_ms:.0f} ms")
    axes.set(xlabel="latency (ms)", ylabel="fraction of messages", title=title, ylim=(0, 1.02))
    return save_plot(plt, figure, axes, path)


def save_plot(plt: Any, figure: Any, axes: Any, path: Path) -> bool:
    """Grid, legend and layout shared by every plot, then the PNG at ``path``."""
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def plot_curve(
    path: Path, title: str, x: Sequence[float], series: Mapping[str, Sequence[float | None]], limit: float | None
) -> bool:
    """Lines of ``series`` (ms) against ``x`` (streams), with the limit dashed; False if not drawn."""
    plt = pyplot()
    if plt is None:
        return False
    figure, axes = plt.subplots(figsize=(7, 4))
    for label, values in series.items():
        points = [(a, b) for a, b in zip(x, values, strict=True) if b is not None]
        axes.plot([a for a, _ in points], [b for _, b in points], marker="o", label=label)
    if limit is not None:
        axes.axhline(limit, linestyle="--", color="grey", label=f"limit {limit:.0f} ms")
    axes.set(xlabel="concurrent real-time streams", ylabel="latency (ms)", title=title)
    axes.set_xticks(list(x))
    return save_plot(plt, figure, axes, path)
