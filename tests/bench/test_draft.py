from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamer.cli.main import main
from tests.conftest import DATA

pytestmark = pytest.mark.model


def test_draft_bench_reports_identical_tokens_and_fewer_passes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    clip = str(DATA / "1089-134686-0000.flac")
    code = main(["bench", "draft", "--file", clip, "--seconds", "6", "--trim-s", "4", "--docs", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out  # non-zero when any update's tokens differ from plain greedy
    assert "updates whose tokens differ: 0 of 6" in out
    ratio = float(out.split("passes ratio (plain / draft): ")[1].split("x")[0])
    assert ratio > 1.2
    written = (tmp_path / "benchmarks.md").read_text()
    assert "## draft" in written and "updates whose tokens differ: 0 of 6" in written
    figures = json.loads((tmp_path / "benchmarks" / "draft.json").read_text())
    assert figures["differing_updates"] == 0 and figures["updates"] == 6
