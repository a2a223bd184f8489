from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import soundfile

from streamer.core.errors import ConfigError
from streamer.engine.types import DecodeRequest, DecodeResult, EngineInfo, SegmentResult, StreamId
from streamer.offline.evaluate import ConfigScore, DatasetItem, FileScore, evaluate, format_table, read_dataset
from streamer.offline.normalize import word_error_rate
from streamer.offline.transcribe import TranscribeOptions

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


class ParrotEngine:
    """Says the same words for every window."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.closed = False

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(model="parrot", multilingual=False, encoder="fp32/cpu", decoder="fp32/cpu")

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        return [
            DecodeResult(
                r.request_id,
                self.text,
                "en",
                (SegmentResult(0, len(r.audio), self.text, (1,), ()),),
                -0.1,
                0.0,
                1.0,
                0.0,
            )  # fmt: skip
            for r in requests
        ]

    def forget_stream(self, stream_id: StreamId) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    audio = (0.1 * np.sin(np.arange(16000) * 0.3)).astype(np.float32)
    (tmp_path / "clips").mkdir()
    for name in ("a", "b"):
        soundfile.write(tmp_path / "clips" / f"{name}.wav", audio, 16000)
    tsv = tmp_path / "set.tsv"
    tsv.write_text("file\ttranscript\nclips/a.wav\tHELLO WORLD\nclips/b.wav\tGoodbye, cruel world!\n")
    return tsv


def test_read_dataset_resolves_paths_and_skips_the_header(dataset: Path) -> None:
    items = read_dataset(dataset)
    assert items == [
        DatasetItem(dataset.parent / "clips" / "a.wav", "HELLO WORLD"),
        DatasetItem(dataset.parent / "clips" / "b.wav", "Goodbye, cruel world!"),
    ]
    assert len(read_dataset(dataset, limit=1)) == 1


def test_read_dataset_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        read_dataset(tmp_path / "none.tsv")
    (tmp_path / "bad.tsv").write_text("a.wav HELLO\n")
    with pytest.raises(ConfigError, match=r"bad\.tsv:1: expected"):
        read_dataset(tmp_path / "bad.tsv")


def test_evaluate_normalises_and_pools(dataset: Path) -> None:
    from streamer.offline.audiofile import load_audio

    items = [(item, load_audio(item.path)) for item in read_dataset(dataset)]
    score = evaluate(ParrotEngine(" Hello, world."), items, config="parrot", options=TranscribeOptions(vad=None))
    assert [f.hypothesis for f in score.files] == ["hello world", "hello world"]
    # "hello world" is right; "goodbye cruel world" heard as "hello world" is 1 substitution and 1 deletion
    assert score.wer.words == 5 and score.wer.errors == 2
    assert score.audio_seconds == pytest.approx(2.0) and score.rtf > 0


def test_table_is_aligned_and_names_skipped_configs() -> None:
    file = FileScore("a.wav", "a b c d", "a b c x", 10.0, 0.5, word_error_rate(["a b c d"], ["a b c x"]))
    table = format_table([ConfigScore("fp32", (file,)), ConfigScore("fp16-decoder", skipped="needs a CUDA GPU")])
    lines = table.splitlines()
    assert lines[0].split() == ["config", "files", "audio", "s", "WER", "%", "RTF"]
    assert lines[1].split() == ["fp32", "1", "10.0", "25.00", "0.050"]
    assert lines[2].split()[:5] == ["fp16-decoder", "-", "-", "-", "-"] and lines[2].endswith(
        "skipped: needs a CUDA GPU"
    )
    # the figures line up under their headers
    assert lines[0].index("RTF") + 3 == lines[1].index("0.050") + 5


@pytest.fixture
def streamer_cli(monkeypatch: pytest.MonkeyPatch) -> Callable[..., int]:
    from streamer.cli import main as cli

    monkeypatch.setattr(cli, "COMMANDS", {"eval": cli.COMMANDS["eval"]})
    return lambda *argv: cli.main([str(a) for a in argv])


def test_eval_command_with_configs(
    streamer_cli: Callable[..., int],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    dataset: Path,
    tmp_path: Path,
) -> None:
    loaded: list[object] = []

    def fake_load(model: str, options: object = None) -> ParrotEngine:
        loaded.append(options)
        return ParrotEngine("hello world")

    monkeypatch.setattr("streamer.engine.load_engine", fake_load)
    monkeypatch.setattr("streamer.engine.cuda_available", lambda: False)
    out_json = tmp_path / "figures.json"
    status = streamer_cli("eval", dataset, "--config", "fp32", "--config", "fp16-decoder", "--json", out_json)
    assert status == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[:2] == ["fp32", "2"] and "skipped: needs a CUDA GPU" in table[2]
    assert len(loaded) == 1  # the CUDA configuration never loaded a model
    figures = json.loads(out_json.read_text())
    assert figures["configs"][0]["words"] == 5 and figures["configs"][1]["skipped"] == "needs a CUDA GPU"


def test_eval_rejects_unknown_configs(
    streamer_cli: Callable[..., int], capsys: pytest.CaptureFixture[str], dataset: Path
) -> None:
    assert streamer_cli("eval", dataset, "--config", "fp64") == 2
    err = capsys.readouterr().err
    assert "unknown --config 'fp64'" in err and "int8-encoder" in err and "Traceback" not in err


@pytest.mark.model
@pytest.mark.skipif(not DATA.is_dir(), reason="real speech not found at ../shared/data")
def test_tiny_en_on_jfk(streamer_cli: Callable[..., int], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "jfk.json"
    assert streamer_cli("eval", DATA / "jfk" / "transcripts.tsv", "--limit", "2", "--json", out_json) == 0
    figures = json.loads(out_json.read_text())["configs"][0]
    assert figures["files"] == 2 and figures["wer"] < 0.15
