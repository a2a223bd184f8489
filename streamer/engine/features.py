"""Whisper's log-mel features, numerically matching transformers' ``WhisperFeatureExtractor``.

Each window is zero-padded to 30 s (:data:`~streamer.core.units.N_SAMPLES`) before the STFT, exactly as the feature
extractor pads, so a short streaming window sees the same features the model was trained on; the frames that see
only the padding are a known constant and skip the STFT. :class:`IncrementalFeatures` also reuses the frames a
stream's previous window already computed. Runs on the engine's worker thread (the event loop never computes
features).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import torch

from streamer.core.units import HOP_LENGTH, N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE
from streamer.engine.types import StreamId

__all__ = ["IncrementalFeatures", "batch_log_mel", "frames_touched", "log_mel_spectrogram", "mel_filters"]


@lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> torch.Tensor:
    """The Slaney-normalised, Slaney-scale mel filter bank, ``[n_fft // 2 + 1, n_mels]``, as transformers' (and
    librosa's) ``mel_filter_bank`` computes it for Whisper -- computed here so serving never imports transformers."""
    min_log_hertz, min_log_mel, logstep = 1000.0, 15.0, 27.0 / np.log(6.4)

    def hertz_to_mel(freq: float) -> float:
        return (
            float(min_log_mel + np.log(freq / min_log_hertz) * logstep) if freq >= min_log_hertz else 3.0 * freq / 200.0
        )

    def mel_to_hertz(mels: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        freq = 200.0 * mels / 3.0
        log_region = mels >= min_log_mel
        freq[log_region] = min_log_hertz * np.exp((mels[log_region] - min_log_mel) / logstep)
        return freq

    filter_freqs = mel_to_hertz(np.linspace(hertz_to_mel(0.0), hertz_to_mel(SAMPLE_RATE / 2), n_mels + 2))
    fft_freqs = np.linspace(0, SAMPLE_RATE // 2, 1 + N_FFT // 2)
    slopes = filter_freqs[np.newaxis, :] - fft_freqs[:, np.newaxis]
    widths = np.diff(filter_freqs)
    bank = np.maximum(0.0, np.minimum(-slopes[:, :-2] / widths[:-1], slopes[:, 2:] / widths[1:]))
    bank *= 2.0 / (filter_freqs[2 : n_mels + 2] - filter_freqs[:n_mels])
    return torch.from_numpy(bank.astype(np.float32))


@lru_cache(maxsize=1)
def _window() -> torch.Tensor:
    return torch.hann_window(N_FFT)


@lru_cache(maxsize=8)
def _constants(device: torch.device, n_mels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The STFT window and the transposed mel filter bank ``[n_mels, n_fft // 2 + 1]`` on ``device``."""
    return _window().to(device), mel_filters(n_mels).T.to(device)


_PAD = N_FFT // 2  # samples of context each side of a frame centre (torch.stft's center=True)
# threads at most that check a batch's prefixes at once (each hashes one window's)
_DIGEST_THREADS = 8
# log10 of the clamp floor: the value of every frame that sees only zero padding
_SILENT = float(torch.tensor(1e-10, dtype=torch.float32).log10())


def frames_touched(num_samples: int) -> int:
    """How many of a window's :data:`N_FRAMES` frames see any of its ``num_samples`` samples; every later frame
    sees only zero padding, so its spectrum is exactly zero and needs no STFT."""
    return min(N_FRAMES, -(-(num_samples + _PAD) // HOP_LENGTH))


def encoder_frames(num_samples: int, pad_seconds: float | None) -> int:
    """Mel frames the encoder reads for a window of ``num_samples``: all :data:`N_FRAMES` (Whisper's 30 s, as it
    was trained) when ``pad_seconds`` is None; else the window's audio and at least ``pad_seconds`` of the silence
    after it, rounded up to whole seconds (fewer shapes for the kernels), at most :data:`N_FRAMES`.

    The model needs that silence: shown its audio alone, or with 1 s after it, it does not see the speech end and
    writes on past it; from 3 s on its WER is the full window's (tests/engine/test_whisper.py holds 3 s and 10 s to
    fp32's WER).
    """
    if pad_seconds is None:
        return N_FRAMES
    seconds = -(-(num_samples + round(pad_seconds * SAMPLE_RATE)) // SAMPLE_RATE)
    return min(N_FRAMES, seconds * (SAMPLE_RATE // HOP_LENGTH))


def _complete_frames(num_samples: int) -> int:
    """Frames that see only real samples up to their right edge: appending audio to the window never changes them
    (the frames after them overlap the zero padding that new audio replaces)."""
    if num_samples + _PAD > N_SAMPLES:  # the right edge reflects the window's last samples
        return max(0, (N_SAMPLES - _PAD) // HOP_LENGTH)
    return max(0, (num_samples - _PAD) // HOP_LENGTH + 1)


def _samples_read(frames: int) -> int:
    """How many of a window's first samples its first ``frames`` frames read."""
    return 0 if frames == 0 else (frames - 1) * HOP_LENGTH + _PAD


def _log_mel_frames(samples: npt.NDArray[np.float32], first: int, last: int, n_mels: int) -> torch.Tensor:
    """``log10(max(mel, 1e-10))`` of frames ``first..last`` of the zero-padded 30 s window ``samples``,
    ``[n_mels, last - first]``, computed from only the samples those frames see."""
    window = np.zeros(N_SAMPLES, dtype=np.float32)
    window[: len(samples)] = samples
    return _log_mel_of(torch.from_numpy(window), first, last, n_mels)


def _log_mel_of(window: torch.Tensor, first: int, last: int, n_mels: int) -> torch.Tensor:
    """``log10(max(mel, 1e-10))`` of frames ``first..last`` of zero-padded 30 s windows ``[..., N_SAMPLES]`` (one,
    or a batch), ``[..., n_mels, last - first]``, computed on the windows' device."""
    # torch.stft(center=True) reflect-pads the whole window; take just the span the frames read
    padded = torch.nn.functional.pad(window.unsqueeze(-2), (_PAD, _PAD), mode="reflect").squeeze(-2)
    span = padded[..., first * HOP_LENGTH : (last - 1) * HOP_LENGTH + N_FFT]
    hann, filters = _constants(window.device, n_mels)
    stft = torch.stft(span, N_FFT, HOP_LENGTH, window=hann, center=False, return_complex=True)
    mel = filters @ (stft.abs() ** 2)
    return torch.clamp(mel, min=1e-10).log10()


def _finish(log_spec: torch.Tensor) -> torch.Tensor:
    """Whisper's per-window dynamic-range clamp and scaling of ``[batch, n_mels, frames]`` log10 mel energies."""
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    return (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0


def _check(samples: npt.NDArray[np.float32]) -> None:
    if len(samples) > N_SAMPLES:
        raise ValueError(f"a window holds at most {N_SAMPLES} samples, got {len(samples)}")


def log_mel_spectrogram(audio: Sequence[npt.NDArray[np.float32]], n_mels: int = 80) -> torch.Tensor:
    """Features of a batch of windows, ``[batch, n_mels, 3000]`` float32 on the CPU.

    Each window is at most 30 s of 16 kHz float32 samples; longer input is a caller bug and raises ValueError. Only
    the frames that see audio go through the STFT; the rest are the exact constant zero padding gives.
    """
    return IncrementalFeatures(n_mels).compute([(None, 0, samples) for samples in audio])


def batch_log_mel(
    audio: Sequence[npt.NDArray[np.float32]], frames: int, device: torch.device, n_mels: int = 80
) -> torch.Tensor:
    """Features ``[batch, n_mels, frames]`` float32 on ``device`` of a batch of windows, in one batched STFT there:
    the first ``frames`` of :func:`log_mel_spectrogram`'s frames (its per-window clamp taken over all of them), for
    an encoder on a GPU, where one pass over a batch of 64 windows costs less than the host's copies of their frames.

    Only the samples travel to the device (one host-to-device copy for the batch), not the host's frames; every frame
    is computed afresh (no reuse between a stream's windows, which would cost the host a digest of each window)."""
    if not 1 <= frames <= N_FRAMES:
        raise ValueError(f"frames must be between 1 and {N_FRAMES}, got {frames}")
    for samples in audio:
        _check(samples)
    longest = max((len(samples) for samples in audio), default=0)
    # every frame that sees audio, even past ``frames``: the clamp's peak is each window's largest over all of them
    # (frames after these see only zero padding, whose value is the least any frame takes)
    computed = max(frames, frames_touched(longest))
    host = torch.zeros((len(audio), max(longest, 1)), dtype=torch.float32)
    for row, samples in zip(host, audio, strict=True):
        row[: len(samples)] = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
    window = torch.zeros((len(audio), N_SAMPLES), dtype=torch.float32, device=device)
    window[:, : host.shape[1]] = host.to(device)
    return _finish(_log_mel_of(window, 0, computed, n_mels))[..., :frames]


@dataclass
class _StreamFrames:
    offset: int  # stream sample where the window these frames belong to starts
    complete: int  # frames [0, complete) of ``log_spec`` will not change as the window grows
    log_spec: torch.Tensor  # [n_mels, complete]
    # how many samples those frames read, and their SHA-256: a window must start with them to share the frames (a
    # digest, not a copy: a copy held 1.9 MB per stream, about 15 MB of a server's 8 streams)
    seen: int
    digest: bytes


class IncrementalFeatures:
    """Log-mel features of streaming windows, computing only the frames a stream's previous window did not.

    A stream's next window usually starts where its previous one did and holds the same audio plus more; the frames
    that saw only that audio are reused, and only the new ones go through the STFT (a window whose start moved is
    computed whole). Windows without a stream id are always computed whole.
    The per-window clamp (``max - 8``) is applied afresh to every window, so the result equals
    :func:`log_mel_spectrogram` of the window. Keyed by stream id; :meth:`forget` drops a stream.
    """

    def __init__(self, n_mels: int = 80) -> None:
        self.n_mels = n_mels
        self._streams: dict[StreamId, _StreamFrames] = {}
        self.frames_computed = 0
        self.frames_reused = 0
        self._digesters: ThreadPoolExecutor | None = None  # made on the first batch with two prefixes to check

    def close(self) -> None:
        """Stop the threads that check a batch's prefixes (the next batch starts them again)."""
        if self._digesters is not None:
            self._digesters.shutdown(wait=False)
            self._digesters = None

    def __len__(self) -> int:
        return len(self._streams)

    def forget(self, stream_id: StreamId) -> None:
        self._streams.pop(stream_id, None)

    def compute(self, windows: Sequence[tuple[StreamId | None, int, npt.NDArray[np.float32]]]) -> torch.Tensor:
        """Features ``[batch, n_mels, 3000]`` of ``(stream id or None, stream offset, samples)`` windows."""
        log_spec = torch.full((len(windows), self.n_mels, N_FRAMES), _SILENT)
        for _, _, samples in windows:
            _check(samples)
        checked = self._check_prefixes(windows)
        for index, (stream_id, offset, samples) in enumerate(windows):
            touched = frames_touched(len(samples))
            reused, prefix = self._reuse(stream_id, offset, samples, log_spec[index], touched, checked.get(index))
            if touched > reused:
                log_spec[index, :, reused:touched] = _log_mel_frames(samples, reused, touched, self.n_mels)
            self.frames_computed += touched - reused
            self.frames_reused += reused
            if stream_id is not None:
                complete = min(_complete_frames(len(samples)), touched)
                read = _samples_read(complete)
                if prefix is None or prefix.seen > read:  # the digest of the previous prefix cannot be extended
                    prefix = _Prefix(0, hashlib.sha256())
                prefix.hasher.update(_buffer(samples[prefix.seen : read]))
                frames = log_spec[index, :, :complete].clone()
                self._streams[stream_id] = _StreamFrames(offset, complete, frames, read, prefix.hasher.digest())
        return _finish(log_spec)

    def _candidate(
        self, stream_id: StreamId | None, offset: int, samples: npt.NDArray[np.float32]
    ) -> _StreamFrames | None:
        """The stream's record whose frames this window may share: the same start, and no longer than the window."""
        previous = self._streams.get(stream_id) if stream_id is not None else None
        if previous is None or previous.offset != offset or len(samples) < previous.seen:
            return None  # a moved start shifts every frame: recompute
        return previous

    def _check_prefixes(
        self, windows: Sequence[tuple[StreamId | None, int, npt.NDArray[np.float32]]]
    ) -> dict[int, _Checked]:
        """The digests :meth:`_reuse` compares, for every window of the batch that may share frames, taken on
        several threads at once when two or more are (SHA-256 lets go of the interpreter lock: on a GPU's batch of
        64 windows, tens of milliseconds of hashing on the engine's thread become a few)."""
        wanted: dict[int, _StreamFrames] = {}
        streams: set[StreamId | None] = set()
        for index, (stream_id, offset, samples) in enumerate(windows):
            record = self._candidate(stream_id, offset, samples)
            if record is not None and stream_id not in streams:  # a stream's later windows in the batch: in turn
                wanted[index] = record
                streams.add(stream_id)
        if len(wanted) < 2:
            return {}  # one (or none): _reuse takes it as it goes
        if self._digesters is None:
            self._digesters = ThreadPoolExecutor(min(_DIGEST_THREADS, os.cpu_count() or 1), "features-digest")
        hashers = self._digesters.map(
            lambda index: hashlib.sha256(_buffer(windows[index][2][: wanted[index].seen])), list(wanted)
        )
        return {index: _Checked(wanted[index], hasher) for index, hasher in zip(wanted, hashers, strict=True)}

    def _reuse(
        self,
        stream_id: StreamId | None,
        offset: int,
        samples: npt.NDArray[np.float32],
        out: torch.Tensor,
        touched: int,
        checked: _Checked | None = None,
    ) -> tuple[int, _Prefix | None]:
        """Copy the stream's frames that this window shares into ``out``; returns how many leading frames that is,
        and the digest of the samples checked (None when none were), for the next window's record to extend.

        Shared means the same start and the same samples under them (checked by digest, not assumed: a caller that
        sends other audio under the same stream id gets correct features, only slower). ``checked``: that digest,
        taken already against the record it was meant for (:meth:`_check_prefixes`)."""
        previous = self._candidate(stream_id, offset, samples)
        if previous is None:
            return 0, None
        if checked is not None and checked.record is previous:
            prefix = _Prefix(previous.seen, checked.hasher)
        else:
            prefix = _Prefix(previous.seen, hashlib.sha256(_buffer(samples[: previous.seen])))
        if prefix.hasher.digest() != previous.digest:
            return 0, None
        count = min(previous.complete, touched)
        out[:, :count] = previous.log_spec[:, :count]
        return count, prefix


def _buffer(samples: npt.NDArray[np.float32]) -> memoryview:
    """The bytes of float32 ``samples``, for a digest (no copy when they are contiguous float32 already)."""
    return np.ascontiguousarray(samples, dtype=np.float32).data.cast("B")


@dataclass
class _Prefix:
    """The running SHA-256 of a window's first ``seen`` samples."""

    seen: int
    hasher: hashlib._Hash


@dataclass(frozen=True)
class _Checked:
    """A window's first ``record.seen`` samples' running SHA-256, taken to compare with ``record``'s digest."""

    record: _StreamFrames
    hasher: hashlib._Hash
