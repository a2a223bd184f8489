"""``streamer bench offline --startup``: the whole ``streamer transcribe`` command, process start to exit, against
faster-whisper's equivalent script, for one short file and for 50 (issue 19: "start-up counts too").

What a user times is the command, not the engine: the interpreter, the imports, the model load and whatever runs
before the first window all count. Each run here is a fresh process given the same model files (the bundled
CTranslate2 directory faster-whisper reads and streamer converts) and the same threads; every contender runs each
file set once per round, who goes first rotating from round to round, so that none always meets a warmer page
cache or a quieter machine. The figures are medians over the rounds, of the wall time and of the CPU time the
process used (user + system, from ``wait4``), and the ratio streamer / faster-whisper of each. Each side's
transcripts are scored (WER) from what it printed, so a fast run that transcribed nothing shows.

``--against REV`` adds ``streamer transcribe`` as committed at REV (a clean git worktree), for before/after figures
measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "FASTER_WHISPER_SCRIPT",
    "VARIANTS",
    "Contender",
    "Summary",
    "Timing",
    "byte_compile",
    "faster_whisper",
    "measure",
    "run_startup",
    "schedule",
    "streamer",
    "summarize",
    "table_rows",
    "time_process",
    "transcripts",
]

# faster-whisper's equivalent of `streamer transcribe FILE...`: load, transcribe each file with its own defaults
# (greedy, English), print one line per file as streamer does (the text alone for one file, "file<TAB>text" for
# several). Arguments: model directory, threads, compute type, files.
FASTER_WHISPER_SCRIPT = """\
import sys
from faster_whisper import WhisperModel
directory, threads, compute_type, *files = sys.argv[1:]
model = WhisperModel(directory, device="cpu", compute_type=compute_type, cpu_threads=int(threads))
for name in files:
    segments, _ = model.transcribe(name, beam_size=1, language="en")
    text = "".join(segment.text for segment in segments).strip()
    print(text if len(files) == 1 else f"{name}\\t{text}", flush=True)
"""


# `streamer transcribe` with one start-up measure undone, by its environment: the weight cache off (the weights cast
# and quantized again); the spin count fixed instead of chosen by the cores' load (streamer.engine.kernels), at the
# command's limit and at libgomp's own default (one of the two is the command's own choice on the machine at hand)
VARIANTS: dict[str, dict[str, str]] = {
    "streamer, no weight cache": {"STREAMER_WEIGHT_CACHE": "0"},
    "streamer, spin count 1,000": {"GOMP_SPINCOUNT": "1000"},
    "streamer, spin count 300,000": {"GOMP_SPINCOUNT": "300000"},
}


# `streamer transcribe` with one start-up measure undone, by its entry: Python's orderly shutdown (main() returns,
# then the interpreter tears every module down; the collector paused as entry() pauses it), the collector left on
# through the imports and the model load (entry() without its pause), and torch imported whole (with its meta
# registrations, before entry() can defer them; the collector paused as entry() pauses it)
SCRIPTED_VARIANTS: dict[str, str] = {
    "streamer, Python's shutdown": (
        "import sys\nfrom streamer.startup import pause_collection\npause_collection()\n"
        "from streamer.cli.main import main\nsys.exit(main())\n"
    ),
    "streamer, collector on": "from streamer.cli import main as cli\ncli.LOADS_A_MODEL = frozenset()\ncli.entry()\n",
    "streamer, torch whole": (
        "from streamer.startup import pause_collection\npause_collection()\nimport torch\n"
        "from streamer.cli.main import entry\nentry()\n"
    ),
}


def byte_compile(root: Path) -> None:
    """Write the bytecode of the ``streamer`` package under ``root`` (as ``pip install .`` does when it installs):
    an editable checkout run with ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile every module on every
    start, which no installed copy does."""
    import compileall

    compileall.compile_dir(str(root / "streamer"), quiet=1)


@dataclass(frozen=True)
class Contender:
    """One command to time: ``argv`` followed by the files, run in ``cwd`` with ``env`` added to the environment."""

    name: str
    argv: tuple[str, ...]
    cwd: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    only: str | None = None  # the one file set it runs on (a variant timed on the short file alone); None: all


def streamer(
    name: str,
    model: str,
    threads: int,
    *,
    root: Path | None = None,
    env: Mapping[str, str] | None = None,
    only: str | None = None,
    script: str | None = None,
) -> Contender:
    """``python -m streamer transcribe`` (from the checkout at ``root``, else this one), its default options, with
    ``env`` added to the environment; ``script``: entered through this Python script (one of
    :data:`SCRIPTED_VARIANTS`) instead of ``streamer.cli.main.entry``."""
    entry = ("-c", script) if script is not None else ("-m", "streamer")
    argv = (sys.executable, *entry, "transcribe", "--model", model, "--threads", str(threads))
    path = {} if root is None else {"PYTHONPATH": str(root)}
    return Contender(name, argv, root, {**path, **(env or {})}, only)


def faster_whisper(name: str, directory: Path, threads: int, compute_type: str) -> Contender:
    """:data:`FASTER_WHISPER_SCRIPT` on the CTranslate2 model in ``directory``."""
    argv = (sys.executable, "-c", FASTER_WHISPER_SCRIPT, str(directory), str(threads), compute_type)
    return Contender(name, argv)


@dataclass(frozen=True)
class Timing:
    """One timed process."""

    contender: str
    files: str  # the file set's label
    round: int
    wall: float  # seconds from the start of the process to its exit
    cpu: float  # user + system seconds of the process (every thread)
    output: str  # what it printed


def schedule(
    contenders: Sequence[str], sets: Sequence[str], rounds: int, only: Mapping[str, str] | None = None
) -> list[tuple[int, str, str]]:
    """``(round, set, contender)`` in the order to run them: round by round, each set in turn, every contender on
    it (but those ``only`` ties to another set), the first of them rotating by one each round (with two
    contenders, who goes first alternates)."""
    only = only or {}
    order = []
    for round_ in range(rounds):
        shift = round_ % len(contenders)
        turn = [*contenders[shift:], *contenders[:shift]]
        order += [(round_, files, who) for files in sets for who in turn if only.get(who, files) == files]
    return order


def time_process(argv: Sequence[str], cwd: Path | None, env: Mapping[str, str]) -> tuple[float, float, str]:
    """Run ``argv`` to its exit: (wall seconds, CPU seconds of the process, stdout); RuntimeError if it fails."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)  # the child's own resource usage, every thread of it
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode != 0:
            tail = " / ".join(err.read().decode(errors="replace").strip().splitlines()[-3:])
            raise RuntimeError(f"{shlex.join(argv[:4])} ... exited with {process.returncode}: {tail}")
        return wall, usage.ru_utime + usage.ru_stime, out.read().decode(errors="replace")


Runner = Callable[[Sequence[str], Path | None, Mapping[str, str]], tuple[float, float, str]]


def measure(
    contenders: Sequence[Contender],
    sets: Mapping[str, Sequence[Path]],
    rounds: int,
    *,
    runner: Runner = time_process,
    progress: Callable[[str], None] | None = None,
) -> list[Timing]:
    """Every contender on its file sets, ``rounds`` times, in :func:`schedule`'s order; one :class:`Timing` each."""
    by_name = {c.name: c for c in contenders}
    only = {c.name: c.only for c in contenders if c.only is not None}
    # one untimed run each first: every round then meets what a user's second run meets (the weight cache written,
    # the libraries and the model in the page cache)
    first = next(iter(sets))
    for contender in contenders:
        runner([*contender.argv, *(str(path) for path in sets[first])], contender.cwd, contender.env)
    timings = []
    for round_, label, name in schedule(list(by_name), list(sets), rounds, only):
        contender = by_name[name]
        argv = [*contender.argv, *(str(path) for path in sets[label])]
        wall, cpu, output = runner(argv, contender.cwd, contender.env)
        timings.append(Timing(name, label, round_, wall, cpu, output))
        if progress is not None:
            progress(f"round {round_ + 1}/{rounds}, {label}, {name}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    return timings


def transcripts(output: str, files: Sequence[Path]) -> list[str]:
    """Each file's transcript from a command's output: all of it for one file, else ``file<TAB>text`` lines (a file
    that printed nothing gets an empty transcript)."""
    if len(files) == 1:
        return [" ".join(output.split())]
    texts: dict[str, str] = {}
    for line in output.splitlines():
        name, tab, text = line.partition("\t")
        if tab:
            texts[name] = text.strip()
    return [texts.get(str(path), "") for path in files]


@dataclass(frozen=True)
class Summary:
    """One contender on one file set, over the rounds."""

    contender: str
    files: str
    runs: int
    wall: float  # median seconds
    cpu: float  # median seconds
    walls: tuple[float, ...]  # every round's, in order


def summarize(timings: Sequence[Timing]) -> list[Summary]:
    """Medians per (contender, file set), in the order they first ran."""
    groups: dict[tuple[str, str], list[Timing]] = {}
    for timing in timings:
        groups.setdefault((timing.contender, timing.files), []).append(timing)
    return [
        Summary(
            contender=who,
            files=label,
            runs=len(group),
            wall=statistics.median(t.wall for t in group),
            cpu=statistics.median(t.cpu for t in group),
            walls=tuple(t.wall for t in group),
        )
        for (who, label), group in groups.items()
    ]


def table_rows(summaries: Sequence[Summary], reference: str, wer: Mapping[tuple[str, str], float]) -> list[list[str]]:
    """One row per contender and file set: medians, each as a ratio to ``reference`` on the same set, and WER."""
    base = {s.files: s for s in summaries if s.contender == reference}
    rows = []
    for s in sorted(summaries, key=lambda s: list(base).index(s.files) if s.files in base else 0):
        ref = base.get(s.files)
        ratio = f"{s.wall / ref.wall:.2f}x" if ref and ref.wall else "-"
        cpu_ratio = f"{s.cpu / ref.cpu:.2f}x" if ref and ref.cpu else "-"
        score = wer.get((s.contender, s.files))
        rows.append(
            [
                s.files,
                s.contender,
                f"{s.wall:.2f}",
                ratio,
                f"{s.cpu:.2f}",
                cpu_ratio,
                "-" if score is None else f"{score:.2f}",
                " ".join(f"{w:.1f}" for w in s.walls),
            ]
        )
    return rows


def run_startup(args: argparse.Namespace) -> int:
    """``bench offline --startup``: time the contenders, print the table, write the ``offline-startup`` section."""
    import importlib.util
    import shutil

    from streamer.bench.offline import _items
    from streamer.bench.report import REPO, Report, command_line, format_table, machine_note, write_report
    from streamer.core.errors import ConfigError
    from streamer.engine.models import resolve
    from streamer.offline.normalize import normalize_english, word_error_rate

    if args.rounds < 1 or args.many < 2:
        raise ConfigError("--rounds must be at least 1 and --many at least 2")
    if importlib.util.find_spec("faster_whisper") is None:  # the script imports it, in its own process
        raise ConfigError("this benchmark needs faster-whisper: pip install 'streamer[bench]'")
    items = _items(args)
    if len(items) < args.many:
        raise ConfigError(f"--many {args.many}: the data set has {len(items)} files")
    paths = {item.path.resolve(): item.reference for item in items[: args.many]}
    sets = {"1 file": list(paths)[:1], f"{args.many} files": list(paths)}
    fw_name = f"faster-whisper {args.compute_type}"
    contenders = [
        faster_whisper(fw_name, resolve(args.model).directory, args.threads, args.compute_type),
        streamer("streamer", args.model, args.threads),
        # what each start-up measure buys, on the short file: the command with that one measure undone
        *(streamer(name, args.model, args.threads, env=env, only="1 file") for name, env in VARIANTS.items()),
        *(
            streamer(name, args.model, args.threads, script=code, only="1 file")
            for name, code in SCRIPTED_VARIANTS.items()
        ),
    ]
    byte_compile(REPO)
    machine = machine_note()
    with tempfile.TemporaryDirectory(prefix="streamer-startup-") as tmp:
        worktree = None
        if args.against:
            command = ["git", "-C", str(REPO), "rev-parse", "--short", args.against]
            commit = subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()
            worktree = Path(tmp) / "against"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), commit], check=True)
            byte_compile(worktree)
            before = streamer(f"streamer at {commit}", args.model, args.threads, root=worktree, only="1 file")
            contenders.append(before)
        try:
            timings = measure(contenders, sets, args.rounds, progress=lambda line: print(line, file=sys.stderr))
        finally:
            if worktree is not None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)
                shutil.rmtree(worktree, ignore_errors=True)
    wer = {}
    for timing in timings:
        if timing.round == 0:
            files = sets[timing.files]
            hyps = [normalize_english(t) for t in transcripts(timing.output, files)]
            refs = [normalize_english(paths[p]) for p in files]
            wer[(timing.contender, timing.files)] = word_error_rate(refs, hyps).wer * 100
    summaries = summarize(timings)
    header = ["files", "command", "wall s", "vs fw", "CPU s", "CPU vs fw", "WER %", "wall s per round"]
    table = format_table(header, table_rows(summaries, fw_name, wer))
    short = next(s for s in summaries if s.contender == "streamer" and s.files == "1 file")
    ref = next(s for s in summaries if s.contender == fw_name and s.files == "1 file")
    ratio = short.wall / ref.wall
    body = (
        f"Whole command, process start to exit, each run a fresh process: `python -m streamer transcribe --model "
        f"{args.model} --threads {args.threads} FILE...` (its defaults) against faster-whisper's script "
        f" (`WhisperModel(dir, device='cpu', compute_type='{args.compute_type}', cpu_threads={args.threads})`, "
        "`transcribe(file, beam_size=1, language='en')`, print) on the same CTranslate2 model files; the first "
        f"LibriSpeech file ({sets['1 file'][0].name}) and the first {args.many}; {args.rounds} rounds, every command "
        "once per round and set, who goes first rotating; medians (wall and user+system CPU of the process), ratios "
        f"to faster-whisper on the same set, WER from each command's printed transcripts; streamer's modules "
        "byte-compiled first, as `pip install .` does. The variants undo one start-up measure each: the weight cache, "
        "the spin count chosen by the cores' load (fixed at the command's limit, then at libgomp's default), the exit "
        "without Python's shutdown, the collector paused until the model is loaded, torch's meta registrations "
        "deferred."
        f"\n\n{table}\n\n"
        f"One short file: streamer / faster-whisper = {ratio:.2f}x wall (target at most 1.5x: "
        f"{'met' if ratio <= 1.5 else 'NOT met'})."
    )
    print(body)
    figures = {
        "machine": machine,
        "summaries": summaries,
        "wer": {f"{who} / {files}": score for (who, files), score in wer.items()},
        "timings": [(t.contender, t.files, t.round, t.wall, t.cpu) for t in timings],
    }
    report = Report("offline-startup", command_line("offline", args), body, figures)
    print(f"wrote {write_report(report, args.docs)}", file=sys.stderr)
    return 0
