"""The GE2E voice encoder (issue 40): its features are librosa's mel power as Resemblyzer computes them, its
weights load from the installed Resemblyzer package without importing it, it tells two LibriSpeech readers apart,
and (where the ``resemblyzer`` package itself imports) its embeddings are Resemblyzer's own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import torch

from streamer.core.errors import ConfigError
from streamer.engine import speaker_encoder
from streamer.engine.features import mel_filters
from streamer.engine.speaker_encoder import (
    EMBEDDING_SIZE,
    MEL_CHANNELS,
    SpeakerEncoder,
    _partial_starts,
    load_speaker_encoder,
    mel_power,
    normalize_volume,
    weights_path,
)
from tests.conftest import load_clip

needs_weights = pytest.mark.skipif(
    importlib.util.find_spec("resemblyzer") is None,
    reason="the Resemblyzer package is not installed (pip install --no-deps Resemblyzer==0.1.4)",
)


def reference_mel_power(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    """librosa.feature.melspectrogram(y, sr=16000, n_fft=400, hop_length=160, n_mels=40).T, read from its
    definition: zero padding of n_fft // 2 each side, a periodic Hann window, |rfft|^2, the Slaney mel bank."""
    padded = np.pad(samples.astype(np.float64), 200)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    frames = np.stack([padded[i * 160 : i * 160 + 400] * window for i in range(1 + len(samples) // 160)])
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    return power @ mel_filters(MEL_CHANNELS).numpy().astype(np.float64)


def test_features_are_librosas_mel_power() -> None:
    samples = load_clip("1089-134686-0000.flac")[:16000]
    ours = mel_power(torch.from_numpy(samples)[None])[0].numpy()
    expected = reference_mel_power(samples)
    assert ours.shape == (101, MEL_CHANNELS) == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-6 * expected.max())


def test_volume_is_brought_up_to_minus_30_dbfs_never_down() -> None:
    quiet = np.full(1600, 0.001, dtype=np.float32)
    raised = normalize_volume(quiet)
    assert 20 * np.log10(np.sqrt(np.mean(np.square(raised)))) == pytest.approx(-30.0, abs=0.01)
    loud = np.full(1600, 0.5, dtype=np.float32)
    assert normalize_volume(loud) is loud
    silent = np.zeros(1600, dtype=np.float32)
    assert normalize_volume(silent) is silent


def test_partials_are_resemblyzers() -> None:
    # compute_partial_slices(n, rate=1.3, min_coverage=0.75): 77 frames apart, the last kept when 3/4 covered
    assert _partial_starts(3 * 16000) == [0, 77, 154]
    assert _partial_starts(16000) == [0]  # shorter than a partial: one, zero-padded
    assert _partial_starts(int(1.7 * 16000)) == [0]  # a second partial 58 % covered is dropped


def test_a_missing_package_is_a_config_error_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="pip install --no-deps Resemblyzer"):
        weights_path()


def test_a_file_that_is_not_a_checkpoint_is_a_model_files_error(tmp_path: Path) -> None:
    from streamer.core.errors import ModelFilesError

    bogus = tmp_path / "pretrained.pt"
    torch.save({"something": torch.zeros(1)}, bogus)
    with pytest.raises(ModelFilesError, match="not a Resemblyzer"):
        SpeakerEncoder(bogus)


@pytest.fixture(scope="module")
def encoder() -> SpeakerEncoder:
    if importlib.util.find_spec("resemblyzer") is None:
        pytest.skip("the Resemblyzer package is not installed (pip install --no-deps Resemblyzer==0.1.4)")
    return load_speaker_encoder()


@needs_weights
def test_the_weights_load_from_the_installed_package_without_importing_it(encoder: SpeakerEncoder) -> None:
    import sys

    imported = "resemblyzer" in sys.modules  # the comparison test below imports it, in whatever order tests run
    assert weights_path().name == "pretrained.pt" and weights_path().is_file()
    assert ("resemblyzer" in sys.modules) == imported
    assert speaker_encoder.load_speaker_encoder() is encoder  # one per process


@needs_weights
def test_windows_of_one_reader_are_closer_than_windows_of_two(encoder: SpeakerEncoder) -> None:
    clips = [load_clip(name) for name in ("1089-134686-0000.flac", "1089-134686-0001.flac", "121-127105-0000.flac")]
    windows = np.stack([clip[8000 : 8000 + 25600] for clip in clips])
    embeddings = encoder.embed_windows(windows)
    assert embeddings.shape == (3, EMBEDDING_SIZE)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    same = float(embeddings[0] @ embeddings[1])
    other = max(float(embeddings[0] @ embeddings[2]), float(embeddings[1] @ embeddings[2]))
    assert same > other + 0.1
    assert encoder.embed_windows(np.zeros((0, 25600), dtype=np.float32)).shape == (0, EMBEDDING_SIZE)
    with pytest.raises(ValueError, match="windows"):
        encoder.embed_windows(np.zeros((2, 100), dtype=np.float32))


def _resemblyzer_imports() -> bool:
    try:
        import resemblyzer  # noqa: F401  (loads librosa: installed only where the comparison is wanted)
    except ImportError:
        return False
    return True


@needs_weights
# resemblyzer's own package imports scipy.ndimage.morphology, which scipy (pulled in by pyannote.metrics) deprecates
@pytest.mark.filterwarnings("ignore:Please import `binary_dilation`:DeprecationWarning")
def test_utterance_embeddings_are_resemblyzers(encoder: SpeakerEncoder) -> None:
    if not _resemblyzer_imports():
        pytest.skip("resemblyzer's own package does not import here (it needs librosa)")
    from resemblyzer import VoiceEncoder, preprocess_wav

    theirs = VoiceEncoder(device="cpu", verbose=False)
    for n in (8000, 25600, 27200, 35200, 160000, 161111):
        _, slices = theirs.compute_partial_slices(n, rate=1.3, min_coverage=0.75)
        assert _partial_starts(n) == [s.start for s in slices]
    for name in ("1089-134686-0000.flac", "1089-134686-0001.flac", "121-127105-0000.flac"):
        wav = preprocess_wav(load_clip(name), source_sr=16000)
        expected = theirs.embed_utterance(wav)
        assert float(encoder.embed_utterance(wav) @ expected) >= 0.999
