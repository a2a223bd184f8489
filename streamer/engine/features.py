"""Whisper's log-mel features, numerically matching transformers' ``WhisperFeatureExtractor``.

Each window is zero-padded to 30 s (:data:`~streamer.units.N_SAMPLES`) before the STFT, exactly as the feature
extractor pads, so a short streaming window sees the same features the model was trained on. Runs on the engine's
worker thread (the caller's event loop never computes features).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import torch

from streamer.units import HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE

__all__ = ["log_mel_spectrogram", "mel_filters"]


@lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> torch.Tensor:
    """The Slaney-normalised mel filter bank, ``[n_fft // 2 + 1, n_mels]``, as transformers computes it."""
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(
        num_frequency_bins=1 + N_FFT // 2,
        num_mel_filters=n_mels,
        min_frequency=0.0,
        max_frequency=SAMPLE_RATE / 2,
        sampling_rate=SAMPLE_RATE,
        norm="slaney",
        mel_scale="slaney",
    )
    return torch.from_numpy(np.asarray(bank, dtype=np.float32))


@lru_cache(maxsize=1)
def _window() -> torch.Tensor:
    return torch.hann_window(N_FFT)


def log_mel_spectrogram(audio: Sequence[npt.NDArray[np.float32]], n_mels: int = 80) -> torch.Tensor:
    """Features of a batch of windows, ``[batch, n_mels, 3000]`` float32 on the CPU.

    Each window is at most 30 s of 16 kHz float32 samples; longer input is a caller bug and raises ValueError.
    """
    batch = np.zeros((len(audio), N_SAMPLES), dtype=np.float32)
    for index, samples in enumerate(audio):
        if len(samples) > N_SAMPLES:
            raise ValueError(f"a window holds at most {N_SAMPLES} samples, got {len(samples)}")
        batch[index, : len(samples)] = samples
    waveform = torch.from_numpy(batch)
    stft = torch.stft(waveform, N_FFT, HOP_LENGTH, window=_window(), return_complex=True)
    magnitudes = (stft[..., :-1].abs() ** 2).contiguous()  # drop the last frame: 3000 frames per 30 s
    mel = mel_filters(n_mels).T @ magnitudes
    log_spec = torch.clamp(mel, min=1e-10).log10()
    peak = log_spec.amax(dim=(1, 2), keepdim=True)  # the dynamic-range clamp is per window
    log_spec = torch.maximum(log_spec, peak - 8.0)
    features = (log_spec + 4.0) / 4.0
    assert features.shape[-1] == N_FRAMES
    return features
