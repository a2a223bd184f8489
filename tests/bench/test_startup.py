"""``streamer bench offline --startup``: the order of the runs, the timing of one process, and the figures."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from streamer.bench.startup import (
    FASTER_WHISPER_SCRIPT,
    SCRIPTED_VARIANTS,
    Contender,
    Timing,
    faster_whisper,
    measure,
    schedule,
    streamer,
    summarize,
    table_rows,
    time_process,
    transcripts,
)


def test_each_round_runs_every_contender_on_each_set_who_goes_first_rotating() -> None:
    order = schedule(["fw", "st", "old"], ["1", "50"], 3, only={"old": "1"})
    assert order[:5] == [(0, "1", "fw"), (0, "1", "st"), (0, "1", "old"), (0, "50", "fw"), (0, "50", "st")]
    assert [who for r, files, who in order if r == 1 and files == "1"] == ["st", "old", "fw"]
    assert [who for r, files, who in order if r == 2 and files == "1"] == ["old", "fw", "st"]
    assert [who for r, files, who in order if files == "50"] == ["fw", "st", "st", "fw", "fw", "st"]
    assert len(order) == 3 * (3 + 2)


def test_the_contenders_commands(tmp_path: Path) -> None:
    ours = streamer("streamer", "tiny.en", 2)
    assert ours.argv[1:] == ("-m", "streamer", "transcribe", "--model", "tiny.en", "--threads", "2")
    assert ours.cwd is None and ours.env == {} and ours.only is None
    before = streamer("old", "tiny.en", 2, root=tmp_path, env={"X": "1"}, only="1 file")
    assert before.cwd == tmp_path and before.env == {"PYTHONPATH": str(tmp_path), "X": "1"}
    theirs = faster_whisper("fw", tmp_path, 2, "int8")
    assert theirs.argv[1:] == ("-c", FASTER_WHISPER_SCRIPT, str(tmp_path), "2", "int8")
    compile(FASTER_WHISPER_SCRIPT, "<faster-whisper>", "exec")


def test_measure_primes_every_contender_then_times_each_run() -> None:
    calls: list[tuple[list[str], Mapping[str, str]]] = []

    def runner(argv: Sequence[str], cwd: Path | None, env: Mapping[str, str]) -> tuple[float, float, str]:
        calls.append((list(argv), env))
        return float(len(calls)), 0.5, f"out {len(calls)}"

    sets = {"1 file": [Path("a.wav")], "2 files": [Path("a.wav"), Path("b.wav")]}
    contenders = [Contender("x", ("x",)), Contender("y", ("y", "-q"), env={"E": "1"}, only="1 file")]
    timings = measure(contenders, sets, 2, runner=runner)
    assert [argv for argv, _ in calls[:2]] == [["x", "a.wav"], ["y", "-q", "a.wav"]]  # untimed: caches warm
    assert [(t.contender, t.files, t.round) for t in timings] == [
        ("x", "1 file", 0), ("y", "1 file", 0), ("x", "2 files", 0),
        ("y", "1 file", 1), ("x", "1 file", 1), ("x", "2 files", 1),
    ]  # fmt: skip
    assert calls[4][0] == ["x", "a.wav", "b.wav"] and calls[3][1] == {"E": "1"}
    assert timings[0].wall == 3.0 and timings[0].output == "out 3"


def test_a_process_is_timed_from_start_to_exit_with_its_own_cpu_time() -> None:
    busy = "import sys; sum(range(3_000_000)); print('done', sys.argv[1])"
    wall, cpu, out = time_process([sys.executable, "-c", busy, "x"], None, {"UNUSED": "1"})
    assert out == "done x\n" and cpu > 0 and wall > 0
    with pytest.raises(RuntimeError, match="exited with 3: boom"):
        time_process([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], None, {})


def test_transcripts_are_read_back_per_file() -> None:
    one = [Path("/d/a.wav")]
    assert transcripts(" Hello  there.\n", one) == ["Hello there."]
    two = [Path("/d/a.wav"), Path("/d/b.wav")]
    assert transcripts("/d/b.wav\tSecond.\n/d/a.wav\t First.\n", two) == ["First.", "Second."]
    assert transcripts("/d/a.wav\tOnly.\nnoise\n", two) == ["Only.", ""]  # a file that printed nothing scores empty


def test_medians_and_ratios_to_the_reference() -> None:
    timings = [Timing("fw", "1 file", r, wall, 1.0, "") for r, wall in enumerate((2.0, 4.0, 3.0))] + [
        Timing("st", "1 file", r, wall, 3.0, "") for r, wall in enumerate((9.0, 4.5, 6.0))
    ]
    summaries = summarize(timings)
    assert [(s.contender, s.wall, s.cpu, s.runs) for s in summaries] == [("fw", 3.0, 1.0, 3), ("st", 6.0, 3.0, 3)]
    assert summaries[1].walls == (9.0, 4.5, 6.0)
    rows = table_rows(summaries, "fw", {("st", "1 file"): 12.5})
    assert rows[1][:7] == ["1 file", "st", "6.00", "2.00x", "3.00", "3.00x", "12.50"]
    assert rows[0][3] == "1.00x" and rows[0][6] == "-"


def test_the_orderly_variant_runs_the_command_through_main_and_pythons_shutdown() -> None:
    import subprocess

    orderly = streamer("orderly", "tiny.en", 2, script=SCRIPTED_VARIANTS["streamer, Python's shutdown"], only="1 file")
    assert orderly.argv[1] == "-c" and orderly.argv[3:5] == ("transcribe", "--model")
    script = orderly.argv[2].replace(
        "sys.exit(main())",
        "import atexit, gc\natexit.register(print, 'shutdown ran')\nprint('collector on:', gc.isenabled())\n"
        "sys.exit(main())",
    )
    result = subprocess.run([sys.executable, "-c", script, "models"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "tiny.en" in result.stdout and result.stdout.rstrip().endswith("shutdown ran")
    assert "collector on: False" in result.stdout  # paused as entry() pauses it: this variant undoes the exit alone


def test_the_collector_variant_enters_as_the_command_does_but_leaves_the_collector_on() -> None:
    import subprocess

    script = SCRIPTED_VARIANTS["streamer, collector on"].replace(
        "cli.entry()", "import gc\nprint('collector on:', gc.isenabled(), flush=True)\ncli.entry()"
    )
    result = subprocess.run([sys.executable, "-c", script, "models"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "tiny.en" in result.stdout and "collector on: True" in result.stdout


def test_the_torch_whole_variant_enters_as_the_command_does_with_torch_imported_whole(tmp_path: Path) -> None:
    import subprocess

    script = SCRIPTED_VARIANTS["streamer, torch whole"].replace(
        "entry()",
        "import gc\nprint('registrations:', 'torch._meta_registrations' in sys.modules, 'collector on:', "
        "gc.isenabled(), flush=True)\nentry()",
    )
    missing = str(tmp_path / "missing.wav")
    command = [sys.executable, "-c", f"import sys\n{script}", "transcribe", missing]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 4 and "no such file" in result.stderr  # the command ran, to its own error
    assert "registrations: True collector on: False" in result.stdout  # torch whole, the collector paused all the same


def test_byte_compile_writes_the_packages_bytecode(tmp_path: Path) -> None:
    from streamer.bench.startup import byte_compile

    (tmp_path / "streamer").mkdir()
    (tmp_path / "streamer" / "thing.py").write_text("X = 1\n")
    byte_compile(tmp_path)
    assert list((tmp_path / "streamer" / "__pycache__").glob("thing.*.pyc"))
