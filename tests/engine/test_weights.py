"""The weight cache: a runtime loaded from it is the runtime built from the checkpoint, bit for bit; a file that is
missing, corrupt, stale or does not fit is rebuilt, never trusted; it can be turned off."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from streamer.engine import weights
from streamer.engine.models import ModelFiles, prepare
from streamer.engine.runtime import FLOAT_LINEARS, Placement, Precision, WhisperRuntime, _quantize_int8
from streamer.engine.weights import (
    Int8Weight,
    cache_file,
    disabled_by_environment,
    int8_skeleton,
    on_a_thread,
    read,
    restore,
    tensors_of,
)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty weight cache folder of this test's own (the model conversion cache is left where it is)."""
    monkeypatch.setattr(weights, "cache_root", lambda: tmp_path)
    monkeypatch.delenv(weights.ENVIRONMENT, raising=False)
    return tmp_path / "weights"


def _files(directory: Path) -> ModelFiles:
    return ModelFiles("m", directory, directory / "tokenizer.json", 10, (), (), ())


@pytest.mark.parametrize(("value", "off"), [("0", True), ("off", True), ("No", True), ("1", False), ("", False)])
def test_the_environment_turns_the_cache_off(value: str, off: bool) -> None:
    assert disabled_by_environment({weights.ENVIRONMENT: value}) is off
    assert disabled_by_environment({}) is False


def test_the_file_name_changes_with_the_model_files_the_placement_and_the_kernels(cache: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 10)
    files = _files(model)
    first = cache_file(files, "encoder bf16/cpu", "amx")
    assert first == cache_file(files, "encoder bf16/cpu", "amx") and first.parent == cache
    assert first.name.startswith("m-encoder_bf16-cpu-")
    assert cache_file(files, "encoder int8/cpu", "amx") != first
    assert cache_file(files, "encoder bf16/cpu", "avx2") != first
    os.utime(model / "model.safetensors", ns=(1, 1))  # the same size, another modification time: another model
    assert cache_file(files, "encoder bf16/cpu", "amx") != first


def test_a_written_file_reads_back_and_replaces_its_older_versions(cache: Path) -> None:
    old, new, other = cache / "m-x-0000000000000000.pt", cache / "m-x-1111111111111111.pt", cache / "m-y-22.pt"
    weights.write(old, {"a": torch.ones(2)})
    weights.write(other, {"a": torch.ones(2)})
    weights.write(new, {"a": torch.arange(3), "b": torch.zeros(1, dtype=torch.float16)})
    back = read(new)
    assert back is not None and torch.equal(back["a"], torch.arange(3)) and back["b"].dtype == torch.float16
    assert sorted(p.name for p in cache.iterdir()) == [new.name, other.name]  # no temporary left, the stale gone


def test_tensors_read_from_a_file_keep_their_values_when_a_newer_process_replaces_it(cache: Path) -> None:
    path = cache / "m-x-0000000000000000.pt"
    weights.write(path, {"a": torch.arange(100_000, dtype=torch.float32)})
    mapped = read(path)  # views of the file's pages, not copies
    assert mapped is not None
    weights.write(path, {"a": torch.zeros(100_000)})  # the next process rebuilt it: a new file put in its place
    assert torch.equal(mapped["a"], torch.arange(100_000, dtype=torch.float32))
    mapped["a"][0] = -1.0  # copy-on-write: the file is never written through
    again = read(path)
    assert again is not None and float(again["a"].abs().sum()) == 0.0


def test_a_corrupt_file_is_reported_and_ignored(cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = cache / "m-x-0.pt"
    assert read(path) is None and not caplog.text  # none yet: nothing to say
    cache.mkdir(parents=True)
    path.write_bytes(b"not a torch file")
    with caplog.at_level(logging.WARNING, logger="streamer.engine.weights"):
        assert read(path) is None
    assert "cannot be read" in caplog.text and "rebuilding it" in caplog.text


def test_a_cache_that_cannot_be_written_costs_only_a_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING, logger="streamer.engine.weights"):
        weights.write(blocker / "weights" / "m-x-0.pt", {"a": torch.ones(1)})
    assert "cannot write the weight cache" in caplog.text


def _layers() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ModuleDict({"fc2": nn.Linear(16, 8)}), nn.LayerNorm(8)).eval()


def test_an_int8_module_restored_into_its_skeleton_computes_the_same(cache: Path) -> None:
    quantized = _quantize_int8(_layers())
    saved = tensors_of(quantized, "m")
    weights.write(cache / "m-x-0.pt", saved)
    loaded = read(cache / "m-x-0.pt")
    assert loaded is not None
    with torch.device("meta"):
        skeleton = _layers()
    skeleton = int8_skeleton(skeleton, FLOAT_LINEARS)
    restore(skeleton, "m", loaded)
    assert not loaded  # every tensor found its place
    x = torch.randn(5, 8)
    with torch.inference_mode():
        first = quantized[1]["fc2"](quantized[0](x))
        second = skeleton[1]["fc2"](skeleton[0](x))
    assert torch.equal(first, second)
    assert type(skeleton[0]) is type(quantized[0]) and type(skeleton[1]["fc2"]) is nn.Linear  # fc2 stays float


def test_int8_layers_restored_unpacked_compute_the_same_once_packed() -> None:
    quantized = _quantize_int8(_layers())
    saved = tensors_of(quantized, "m")
    with torch.device("meta"):
        skeleton = _layers()
    skeleton = int8_skeleton(skeleton, FLOAT_LINEARS)
    unpacked: list[Int8Weight] = []
    restore(skeleton, "m", saved, unpacked=unpacked)
    assert not saved
    assert [weight.layer for weight in unpacked] == [skeleton[0]]  # the INT8 layer, checked, not yet packed
    assert tuple(skeleton[0].weight().shape) == (1, 1)  # still the placeholder
    for weight in unpacked:
        weight.pack()
    x = torch.randn(5, 8)
    with torch.inference_mode():
        assert torch.equal(quantized[1]["fc2"](quantized[0](x)), skeleton[1]["fc2"](skeleton[0](x)))


def test_jobs_on_a_thread_run_in_order_and_each_failure_reaches_its_future() -> None:
    ran: list[int] = []

    def fail() -> None:
        ran.append(2)
        raise RuntimeError("could not pack")

    first, second, third = on_a_thread([lambda: ran.append(1), fail, lambda: ran.append(3)], "test-jobs")
    assert third.result(60) is None and first.result() is None
    with pytest.raises(RuntimeError, match="could not pack"):
        second.result()
    assert ran == [1, 2, 3]


def test_the_packing_thread_holds_the_process_until_it_has_packed() -> None:
    """Not a daemon: a process that ends while the encoder is packed (a library user who returns without a warm-up)
    waits for it, where a daemon thread inside torch's kernels at shutdown aborts the process."""
    daemon: list[bool] = []
    (future,) = on_a_thread([lambda: daemon.append(threading.current_thread().daemon)], "test-jobs")
    future.result(timeout=60)
    assert daemon == [False]


def test_tensors_that_do_not_fit_are_refused() -> None:
    saved = tensors_of(_layers(), "m")
    saved["m.2.weight"] = torch.ones(9)
    with torch.device("meta"):
        skeleton = _layers()
    with pytest.raises(ValueError, match=r"m.2.weight: expected torch.float32 \[8\]"):
        restore(skeleton, "m", dict(saved))
    del saved["m.2.weight"]
    with pytest.raises(ValueError, match=r"no m\.2\.weight"):
        restore(skeleton, "m", saved)


# --- the real model ----------------------------------------------------------------------------------------------


def _outputs(runtime: WhisperRuntime) -> tuple[torch.Tensor, torch.Tensor]:
    from streamer.engine.features import log_mel_spectrogram

    tone = (0.1 * np.sin(np.linspace(0, 2000, 16000 * 3))).astype(np.float32)
    states = runtime.encode(log_mel_spectrogram([tone]))
    logits, _ = runtime.decode_step(torch.tensor([[50257, 50362, 440]]), runtime.new_cache(1), runtime.cross_kv(states))
    return states.float(), logits


def _default_encoder() -> Precision:
    from streamer.engine.kernels import kernel_report

    return Precision(kernel_report().default_encoder)


@pytest.mark.model
@pytest.mark.kernels
@pytest.mark.parametrize("component", ["default encoder", "int8 decoder"])
def test_a_runtime_from_the_cache_is_the_runtime_built_from_the_checkpoint(
    component: str, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = prepare("tiny.en")
    encoder = Placement(_default_encoder() if component == "default encoder" else Precision.INT8, "cpu")
    decoder = Placement(Precision.INT8 if component == "int8 decoder" else Precision.FP32, "cpu")
    built = WhisperRuntime(files, encoder, decoder)
    WhisperRuntime(files, encoder, decoder, weight_cache=True)  # builds it too, and writes the cache
    assert len(list(cache.glob("*.pt"))) == 1

    def no_checkpoint(directory: Path) -> None:
        raise AssertionError("the cached runtime read the checkpoint")

    monkeypatch.setattr("streamer.engine.runtime.load_network", no_checkpoint)
    cached = WhisperRuntime(files, encoder, decoder, weight_cache=True)
    for ours, theirs in zip(_outputs(cached), _outputs(built), strict=True):
        assert torch.equal(ours, theirs)
    assert type(cached.projection) is type(built.projection)


@pytest.mark.model
def test_a_failed_packing_of_the_encoder_fails_its_every_use(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = prepare("tiny.en")
    encoder, decoder = Placement(Precision.INT8, "cpu"), Placement(Precision.FP32, "cpu")
    WhisperRuntime(files, encoder, decoder, weight_cache=True)  # writes the cache

    def broken(self: Int8Weight) -> None:
        raise RuntimeError("fbgemm could not pack")

    monkeypatch.setattr(Int8Weight, "pack", broken)
    cached = WhisperRuntime(files, encoder, decoder, weight_cache=True)  # the packing fails on its thread
    for _ in range(2):  # never the placeholder's output
        with pytest.raises(RuntimeError, match="fbgemm could not pack"):
            cached.probe()
        with pytest.raises(RuntimeError, match="fbgemm could not pack"):
            _outputs(cached)


@pytest.mark.model
def test_a_corrupt_or_stale_cache_is_rebuilt(cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = prepare("tiny.en")
    encoder, decoder = Placement(Precision.INT8, "cpu"), Placement(Precision.FP32, "cpu")
    WhisperRuntime(files, encoder, decoder, weight_cache=True)
    (path,) = cache.glob("*.pt")
    tensors = read(path)
    assert tensors is not None
    del tensors["decoder.layer_norm.weight"]  # a file from a network of another shape
    weights.write(path, tensors)
    with caplog.at_level(logging.WARNING):
        WhisperRuntime(files, encoder, decoder, weight_cache=True)
    assert "whose tensors do not fit (no decoder.layer_norm.weight); rebuilding it" in caplog.text
    fixed = read(path)
    assert fixed is not None and "decoder.layer_norm.weight" in fixed  # written again, whole
    path.write_bytes(path.read_bytes()[:1000])  # cut short, as by a full disk
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        runtime = WhisperRuntime(files, encoder, decoder, weight_cache=True)
    assert "cannot be read" in caplog.text
    assert runtime.encoder is not None and read(path) is not None


@pytest.mark.model
def test_the_environment_keeps_the_engine_off_the_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamer.engine import EngineOptions, load_engine

    monkeypatch.setenv(weights.ENVIRONMENT, "0")
    load_engine("tiny.en", EngineOptions(encoder_precision="int8", warmup=False))
    assert not cache.exists()
    monkeypatch.delenv(weights.ENVIRONMENT)
    load_engine("tiny.en", EngineOptions(encoder_precision="int8", warmup=False, weight_cache=False))
    assert not cache.exists()
    load_engine("tiny.en", EngineOptions(encoder_precision="int8", warmup=False))
    assert len(list(cache.glob("*.pt"))) == 1


def test_reading_int8_weights_prints_no_deprecation_warning(tmp_path: Path) -> None:
    """torch 2.13 warns, once per process, when a quantized tensor is rebuilt; every start of ``streamer
    transcribe`` reads them from the cache, so the warning would reach every user. The cache is written in one
    process and read in a fresh one (quantizing has already spent the process's one warning)."""
    path = str(tmp_path / "m-x-0.pt")
    write = (
        "import sys, torch\n"
        "from streamer.engine import weights\n"
        "from streamer.engine.runtime import _quantize_int8\n"
        "layer = _quantize_int8(torch.nn.Sequential(torch.nn.Linear(8, 8)))\n"
        "weights.write(__import__('pathlib').Path(sys.argv[1]), weights.tensors_of(layer, 'm'))\n"
    )
    read = "import sys, pathlib\nfrom streamer.engine import weights\nassert weights.read(pathlib.Path(sys.argv[1]))\n"
    for script in (write, read):
        done = subprocess.run(
            [sys.executable, "-W", "default", "-c", script, path], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
