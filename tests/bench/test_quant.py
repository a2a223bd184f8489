"""``streamer bench quant``: one process per configuration, GPU rows skipped without CUDA, table and report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamer.bench.quant import QuantRow, format_rows, peak_rss_mib
from streamer.cli.main import main
from streamer.engine import cuda_available
from tests.conftest import DATA


def test_peak_rss_is_plausible() -> None:
    assert 10 < peak_rss_mib() < 1 << 20


def test_format_rows_gives_speed_relative_to_the_first_measured() -> None:
    rows = [
        QuantRow("fp32", 2, 10.0, 5.0, 10.0, 500.0, 100.0),
        QuantRow("int8-encoder", 2, 10.0, 2.5, 12.0, 300.0, 100.0),
        QuantRow("fp16-decoder", skipped="needs a CUDA GPU; there is none here"),
    ]
    table = format_rows(rows)
    assert "speed vs fp32" in table
    assert "2.00x" in table  # twice as fast as fp32
    assert "skipped: needs a CUDA GPU" in table


def test_quant_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "quant", "--engine", "fake", "--limit", "1", "--tsv", str(DATA / "transcripts.tsv"),
                 "--config", "fp32", "--config", "fp16-decoder", "--docs", str(tmp_path)])  # fmt: skip
    assert code == 0
    assert "| fp32" in capsys.readouterr().out
    figures = json.loads((tmp_path / "benchmarks" / "quant.json").read_text())
    fp32, gpu = figures["rows"]
    assert fp32["files"] == 1 and fp32["peak_rss_mib"] > 0 and fp32["wer"] == 100.0  # the fake says nothing
    # fp16-decoder needs CUDA: it runs where there is some, and is skipped, saying why, where there is none
    skipped = None if cuda_available() else "needs a CUDA GPU; there is none here"
    assert (gpu["config"], gpu["skipped"], gpu["files"]) == ("fp16-decoder", skipped, 0 if skipped else 1)
    assert "## quant" in (tmp_path / "benchmarks.md").read_text()


def test_quant_bench_refuses_unknown_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "quant", "--config", "nope", "--docs", str(tmp_path)]) == 2
    assert "unknown --config" in capsys.readouterr().err
