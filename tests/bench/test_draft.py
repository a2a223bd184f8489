from __future__ import annotations

import pytest

from streamer.cli import main
from tests.conftest import DATA

pytestmark = pytest.mark.model


def test_draft_bench_reports_identical_tokens_and_fewer_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "draft", "--file", str(DATA / "1089-134686-0000.flac"), "--seconds", "6", "--trim-s", "4"])
    out = capsys.readouterr().out
    assert code == 0, out  # non-zero when any update's tokens differ from plain greedy
    assert "updates whose tokens differ: 0 of 6" in out
    ratio = float(out.split("passes ratio (plain / draft): ")[1].split("x")[0])
    assert ratio > 1.2
