from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamer.bench.gains import VARIANTS, VariantMeasured, format_results
from streamer.cli.main import main
from tests.conftest import DATA


def test_the_full_engine_comes_first_and_every_other_variant_turns_something_off() -> None:
    full = VARIANTS[0]
    assert full.draft_decoding and full.incremental_features and full.batched and full.early_stop
    assert full.encoder_precision is None
    assert all(v != full for v in VARIANTS[1:])
    assert len({v.name for v in VARIANTS}) == len(VARIANTS)


def test_results_are_printed_as_ratios_to_the_full_engine() -> None:
    table = format_results([VariantMeasured(VARIANTS[0], 10, 1.0, 60), VariantMeasured(VARIANTS[2], 10, 1.5, 150)])
    assert "| full engine" in table and "1.00x" in table
    assert "1.50x" in table and "15.0" in table  # passes per window
    assert "10.0" in table and "6.7" in table  # streams at one window a second: 1000 / ms per window


def test_an_unknown_variant_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "gains", "--only", "warp drive", "--file", str(DATA / "1089-134686-0000.flac")])
    assert code != 0
    assert "unknown variant" in capsys.readouterr().err


@pytest.mark.model
def test_gains_bench_measures_each_variant_on_the_same_windows(tmp_path: Path) -> None:
    code = main(
        [
            "bench",
            "gains",
            "--streams",
            "2",
            "--seconds",
            "5",
            "--only",
            "no draft",
            "--file",
            str(DATA / "1089-134686-0000.flac"),
            "--docs",
            str(tmp_path),
        ]  # fmt: skip
    )
    assert code == 0
    figures = json.loads((tmp_path / "benchmarks" / "gains.json").read_text())
    results = {r["configuration"]: r for r in figures["results"]}
    assert set(results) == {"full engine", "no draft"}
    assert results["full engine"]["windows"] == results["no draft"]["windows"] > 0
    assert results["no draft"]["passes_per_window"] > results["full engine"]["passes_per_window"]
    assert "<!-- bench:gains -->" in (tmp_path / "benchmarks.md").read_text()
