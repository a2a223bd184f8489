"""The report helpers: distributions, the Markdown table, the command line, sections of benchmarks.md, plots."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import pytest

from streamer.bench.report import (
    MATPLOTLIB_HINT,
    REPO,
    Distribution,
    Report,
    command_line,
    format_table,
    plot_cdfs,
    plot_curve,
    replace_section,
    repo_relative,
    write_report,
)


def test_distribution_of_values() -> None:
    d = Distribution.of(float(v) for v in range(1, 101))
    assert (d.count, d.p50, d.max, d.mean) == (100, 50.5, 100.0, 50.5)
    assert d.p95 == pytest.approx(95.05)
    assert d.format("ms") == "p50 50 / p95 95 / max 100 ms (n 100)"


def test_distribution_of_nothing() -> None:
    d = Distribution.of([])
    assert (d.count, d.p50, d.p95, d.max, d.mean) == (0, None, None, None, None)
    assert d.format("ms") == "none"


def test_format_table_aligns_columns() -> None:
    table = format_table(["name", "value"], [["a", "1"], ["longer", "100"]])
    lines = table.splitlines()
    assert lines[0] == "| name   | value |"
    assert lines[1] == "|--------|------:|"
    assert lines[3] == "| longer |   100 |"
    assert len({len(line) for line in lines}) == 1


def test_command_line_renders_every_option() -> None:
    args = argparse.Namespace(
        command="bench", benchmark="stream", verbose=0, docs=Path("/x"), file=[Path("a b.flac")], all=False,
        speed=1.0, threads=None, dry=True, argv=["bench", "stream", "--dry"],
    )  # fmt: skip
    assert command_line("stream", args) == "streamer bench stream --file 'a b.flac' --speed 1.0 --dry"


def test_paths_in_what_a_bench_writes_are_relative_to_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "main"
    text = f"--file {tmp_path}/shared/data/a.flac --docs {repo}/docs and /usr/bin/x"
    assert repo_relative(text, repo) == "--file ../shared/data/a.flac --docs docs and /usr/bin/x"
    # command_line and write_report use the real repository
    args = argparse.Namespace(file=[REPO.parent / "shared" / "data" / "b.flac"])
    assert command_line("stream", args) == "streamer bench stream --file ../shared/data/b.flac"
    when = datetime.datetime(2025, 1, 2, 3, 4, tzinfo=datetime.UTC)
    figures = {"file": REPO / "docs" / "x.json"}
    markdown = write_report(
        Report("x", f"streamer bench x --tsv {REPO.parent}/shared/t.tsv", "", figures), tmp_path, when=when
    )
    assert str(REPO) not in markdown.read_text() and "--tsv ../shared/t.tsv" in markdown.read_text()
    assert json.loads((tmp_path / "benchmarks" / "x.json").read_text())["file"] == "docs/x.json"


def test_replace_section_appends_then_replaces_in_place() -> None:
    document = replace_section("# Benchmarks\n", "stream", "## stream\nfirst")
    document = replace_section(document, "quant", "## quant\nq")
    again = replace_section(document, "stream", "## stream\nsecond")
    assert "first" not in again and "second" in again
    assert again.index("## stream") < again.index("## quant")  # kept its place
    assert again.count("<!-- bench:stream -->") == 1
    assert replace_section(again, "stream", "## stream\nsecond") == again


def test_write_report_writes_json_and_section(tmp_path: Path) -> None:
    when = datetime.datetime(2025, 1, 2, 3, 4, tzinfo=datetime.UTC)
    report = Report("stream", "streamer bench stream", "body text", {"value": 1.23456, "d": Distribution.of([1.0])})
    markdown = write_report(report, tmp_path, when=when)
    write_report(Report("quant", "streamer bench quant", "quant body", {}), tmp_path, when=when)
    write_report(report, tmp_path, when=when)
    text = markdown.read_text()
    assert text.startswith("# Benchmarks")
    assert text.count("## stream") == 1 and text.count("## quant") == 1
    assert "`streamer bench stream`" in text and "2025-01-02 03:04 UTC" in text and "body text" in text
    figures = json.loads((tmp_path / "benchmarks" / "stream.json").read_text())
    assert figures["command"] == "streamer bench stream"
    assert figures["value"] == 1.2346
    assert figures["d"]["p50"] == 1.0


def test_plots_are_png_files(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    assert plot_cdfs(tmp_path / "cdf.png", "t", {"partial": [1.0, 5.0, 3.0], "final": []}, 2000)
    assert plot_curve(tmp_path / "curve.png", "t", [1, 2], {"p95": [100.0, None]}, 2000)
    for name in ("cdf.png", "curve.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_without_matplotlib_say_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert not plot_cdfs(tmp_path / "cdf.png", "t", {"partial": [1.0]}, None)
    assert MATPLOTLIB_HINT in capsys.readouterr().err
    assert not (tmp_path / "cdf.png").exists()
