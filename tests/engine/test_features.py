from __future__ import annotations

import numpy as np
import pytest

from streamer.engine.features import log_mel_spectrogram
from streamer.units import N_FRAMES, N_SAMPLES
from tests.conftest import load_clip


def test_matches_transformers_feature_extractor_on_real_speech() -> None:
    from transformers import WhisperFeatureExtractor

    audio = load_clip("1089-134686-0000.flac")
    expected = WhisperFeatureExtractor(feature_size=80)(audio, sampling_rate=16000, return_tensors="np")
    ours = log_mel_spectrogram([audio])
    assert ours.shape == (1, 80, N_FRAMES)
    assert np.abs(ours[0].numpy() - expected.input_features[0]).max() < 1e-4


def test_batched_windows_are_computed_independently() -> None:
    a = load_clip("1089-134686-0000.flac")
    b = load_clip("1089-134686-0001.flac")
    batch = log_mel_spectrogram([a, b])
    assert np.allclose(batch[1].numpy(), log_mel_spectrogram([b])[0].numpy(), atol=1e-5)
    assert np.allclose(batch[0].numpy(), log_mel_spectrogram([a])[0].numpy(), atol=1e-5)


def test_longer_than_a_window_is_refused() -> None:
    with pytest.raises(ValueError, match="at most"):
        log_mel_spectrogram([np.zeros(N_SAMPLES + 1, dtype=np.float32)])
