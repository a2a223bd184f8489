"""Speaker embeddings: the GE2E d-vector voice encoder whose weights ship in the ``Resemblyzer`` wheel (issue 40).

The network is Resemblyzer's (Apache-2.0; Wan et al. 2018, "Generalized End-to-End Loss for Speaker Verification",
arXiv:1710.10467), written here in torch so that serving never imports the ``resemblyzer`` package, whose import
loads librosa (and with it numba and scipy): 40 mel channels of power (not log) at 16 kHz, a 25 ms window every
10 ms; a 3-layer LSTM of 256 units; the last layer's final hidden state through a 256 -> 256 linear layer and a
ReLU; L2-normalised. Resemblyzer's features are ``librosa.feature.melspectrogram`` defaults: a periodic Hann window
of 400 samples, frames centred with zero padding (librosa >= 0.10), power 2, the Slaney mel bank (the one Whisper's
features use, :func:`streamer.engine.features.mel_filters`). tests/engine/test_speaker_encoder.py checks the
features and the embedding against a plain numpy reading of the same definitions, and, where ``resemblyzer`` itself
imports, against its ``VoiceEncoder.embed_utterance``.

The weights (``resemblyzer/pretrained.pt``, 17 MB) are read from the installed package's folder, found without
importing it, and loaded with ``weights_only=True``: nothing is fetched at run time.

Input scale matters (the features are power, not log power): Resemblyzer trained on, and embeds, audio brought up
to -30 dBFS (never down). :meth:`SpeakerEncoder.embed_windows` does the same per window.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from streamer.core.errors import ConfigError, ModelFilesError
from streamer.core.units import HOP_LENGTH, N_FFT, SAMPLE_RATE
from streamer.engine.features import mel_filters

__all__ = [
    "EMBEDDING_SIZE",
    "MEL_CHANNELS",
    "PARTIAL_FRAMES",
    "TARGET_DBFS",
    "WEIGHTS_FILE",
    "SpeakerEncoder",
    "load_speaker_encoder",
    "mel_power",
    "normalize_volume",
    "weights_path",
]

MEL_CHANNELS = 40  # GE2E's filterbank: 40 mel channels over 0-8 kHz
HIDDEN_SIZE = 256  # LSTM units per layer
LAYERS = 3
EMBEDDING_SIZE = 256  # the d-vector
PARTIAL_FRAMES = 160  # Resemblyzer's partial utterance: 160 frames of HOP_LENGTH = 1.6 s, what the model trained on
TARGET_DBFS = -30.0  # Resemblyzer's audio_norm_target_dBFS: quieter audio is brought up to it, louder left alone
WEIGHTS_FILE = "pretrained.pt"  # in the resemblyzer package folder
_INT16_MAX = 2**15 - 1
_INSTALL = "pip install --no-deps Resemblyzer==0.1.4 (only its weights file is read)"
# embed_utterance's defaults in Resemblyzer: 1.3 partials a second, a last partial kept when 3/4 covered
_UTTERANCE_RATE = 1.3
_UTTERANCE_MIN_COVERAGE = 0.75


def weights_path() -> Path:
    """``pretrained.pt`` inside the installed ``resemblyzer`` package, found without importing it (its import loads
    librosa). Raises :class:`~streamer.core.errors.ConfigError` when the package is not installed."""
    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"speaker labels need the Resemblyzer package's voice encoder weights: {_INSTALL}")
    path = Path(next(iter(spec.submodule_search_locations))) / WEIGHTS_FILE
    if not path.is_file():
        raise ConfigError(f"the installed resemblyzer package lacks {WEIGHTS_FILE}: {_INSTALL}")
    return path


def normalize_volume(samples: npt.NDArray[np.float32], target_dbfs: float = TARGET_DBFS) -> npt.NDArray[np.float32]:
    """``samples`` brought up to ``target_dbfs`` (RMS of the int16 scale), never down: Resemblyzer's
    ``normalize_volume(wav, -30, increase_only=True)``. Silence (RMS 0) is returned as it is."""
    rms = float(np.sqrt(np.mean(np.square(samples.astype(np.float64) * _INT16_MAX)))) if len(samples) else 0.0
    if rms == 0.0:
        return samples
    change = target_dbfs - 20.0 * np.log10(rms / _INT16_MAX)
    if change <= 0:
        return samples
    return (samples * np.float32(10.0 ** (change / 20.0))).astype(np.float32)


@functools.cache
def _hann() -> torch.Tensor:
    return torch.hann_window(N_FFT, periodic=True)  # scipy's get_window("hann", fftbins=True), librosa's default


def mel_power(batch: torch.Tensor) -> torch.Tensor:
    """The encoder's features of ``[batch, samples]`` float32 audio: ``[batch, 1 + samples // HOP_LENGTH,
    MEL_CHANNELS]`` mel power, frames centred on every HOP_LENGTH-th sample with zero padding (librosa's
    ``melspectrogram(y, sr=16000, n_fft=400, hop_length=160, n_mels=40)``, transposed)."""
    spectrum = torch.stft(
        batch, N_FFT, HOP_LENGTH, window=_hann(), center=True, pad_mode="constant", return_complex=True
    )
    power = spectrum.real.square() + spectrum.imag.square()  # [batch, N_FFT // 2 + 1, frames]
    return torch.matmul(power.transpose(1, 2), mel_filters(MEL_CHANNELS))


class _Network(nn.Module):
    """Resemblyzer's ``VoiceEncoder`` layers under the same names, so its ``model_state`` loads as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(MEL_CHANNELS, HIDDEN_SIZE, LAYERS, batch_first=True)
        self.linear = nn.Linear(HIDDEN_SIZE, EMBEDDING_SIZE)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        raw: torch.Tensor = torch.relu(self.linear(hidden[-1]))
        # a window whose every unit is cut to 0 by the ReLU has no direction: it stays 0 rather than NaN
        norm: torch.Tensor = torch.linalg.vector_norm(raw, dim=1, keepdim=True)
        return raw / norm.clamp_min(1e-12)


class SpeakerEncoder:
    """The loaded voice encoder, shared by every stream of the process; stateless. Call :meth:`embed_windows` with a
    batch of equal-length windows (the core's planner says which), or :meth:`embed_utterance` for a whole span."""

    def __init__(self, path: Path | None = None) -> None:
        path = weights_path() if path is None else path
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
            state = {k: v for k, v in checkpoint["model_state"].items() if not k.startswith("similarity_")}
            self._network = _Network()
            self._network.load_state_dict(state, strict=True)
        except (OSError, KeyError, RuntimeError) as exc:
            raise ModelFilesError(f"{path}: not a Resemblyzer voice encoder checkpoint ({exc})") from exc
        self._network.eval()

    @torch.inference_mode()
    def embed_mels(self, mels: torch.Tensor) -> npt.NDArray[np.float32]:
        """Embeddings ``[batch, EMBEDDING_SIZE]`` (unit length, or 0) of ``[batch, frames, MEL_CHANNELS]`` features."""
        return np.asarray(self._network(mels).numpy(), dtype=np.float32)

    def embed_windows(self, windows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Embeddings ``[n, EMBEDDING_SIZE]`` of ``[n, samples]`` windows of 16 kHz audio, each brought up to
        :data:`TARGET_DBFS` first and read as its first ``samples // HOP_LENGTH`` frames (1.6 s = 160 frames is what
        the network trained on). An empty batch gives ``[0, EMBEDDING_SIZE]``."""
        windows = np.asarray(windows, dtype=np.float32)
        if windows.ndim != 2 or windows.shape[1] < N_FFT:
            raise ValueError(f"windows must be [n, samples >= {N_FFT}], got {windows.shape}")
        if not len(windows):
            return np.zeros((0, EMBEDDING_SIZE), dtype=np.float32)
        levelled = np.stack([normalize_volume(w) for w in windows])
        frames = windows.shape[1] // HOP_LENGTH
        return self.embed_mels(mel_power(torch.from_numpy(levelled))[:, :frames])

    def embed_utterance(self, samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """One embedding of a whole utterance as Resemblyzer's ``embed_utterance`` computes it from audio its
        ``preprocess_wav`` prepared: 1.6 s partials 1.3 times a second over the features of the whole (zero-padded
        to the last partial), their embeddings averaged and L2-normalised. No volume change here: ``samples`` are
        taken as prepared (see :func:`normalize_volume`)."""
        samples = np.asarray(samples, dtype=np.float32)
        starts = _partial_starts(len(samples))
        padded_length = (starts[-1] + PARTIAL_FRAMES) * HOP_LENGTH
        padded = np.pad(samples, (0, max(0, padded_length - len(samples))))
        mel = mel_power(torch.from_numpy(padded)[None])[0]
        partials = self.embed_mels(torch.stack([mel[s : s + PARTIAL_FRAMES] for s in starts]))
        mean = partials.mean(axis=0)
        return np.asarray(mean / np.linalg.norm(mean), dtype=np.float32)


def _partial_starts(n_samples: int) -> list[int]:
    """First frames of Resemblyzer's partial utterances (``compute_partial_slices`` at its defaults)."""
    n_frames = int(np.ceil((n_samples + 1) / HOP_LENGTH))
    step = round((SAMPLE_RATE / _UTTERANCE_RATE) / HOP_LENGTH)
    starts = list(range(0, max(1, n_frames - PARTIAL_FRAMES + step + 1), step))
    coverage = (n_samples - starts[-1] * HOP_LENGTH) / (PARTIAL_FRAMES * HOP_LENGTH)
    if coverage < _UTTERANCE_MIN_COVERAGE and len(starts) > 1:
        starts.pop()
    return starts


@functools.cache
def load_speaker_encoder() -> SpeakerEncoder:
    """The process's one :class:`SpeakerEncoder` (stateless, so servers and runs in one process share it), loaded on
    the first call (a server with diarization calls it at start-up, so that a missing package fails there and the
    weights are resident before the first stream)."""
    return SpeakerEncoder()
