"""Steady-tone detection: telephone signalling tones are not speech, however voiced they look (issue 16).

Sans-I/O: :class:`ToneDetector` takes the voice activity detector's frames in order, a chunk's at once (16 kHz float32,
any frame length) and says for each whether it is a steady tone. The VAD treats such a frame as unvoiced, so a tone
never starts or prolongs a speech span and never reaches the engine (tiny.en reads a -19 dBFS ringback as "Beep").

What a steady tone is here: one or two sinusoids that hold nearly all of the frame's energy between 80 and 4000 Hz
(the telephone band and a little more), at the same frequencies as in the frame before. That covers DTMF digits
(ITU-T Q.23: one low-group and one high-group frequency), call-progress tones (ringback 440+480 Hz, dial 350+440 Hz,
busy 480+620 Hz, the 400+450 Hz and 425 Hz tones of other countries), fax and modem calling tones (1100 Hz CNG,
2100 Hz CED) and test tones, without a table of frequencies. Voiced speech is harmonic: even a low voice whose first
harmonic dominates a vowel keeps a few percent of its energy in other harmonics and in the formants above, and its
pitch moves from frame to frame; the measurements behind the thresholds are in :class:`ToneOptions`.

Cost: one 1024-point real FFT per frame, batched over a chunk's frames with the statistics that follow (issue 37: at one
frame per call, numpy's per-call overhead cost more than the FFT), a second, shorter look when the strongest frequency
is a DTMF one, and a bounded buffer of the last 1024 samples, so CPU per stream is linear in the audio and memory
constant in its length.

Music is not claimed here: notes are not pure (a guitar's strings and body fill the band with partials). Held notes
are :mod:`streamer.core.music`'s (issue 39).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE

__all__ = ["ToneDetector", "ToneOptions", "TrailingWindows"]

_N_FFT = 1024  # 64 ms: resolves 440 from 480 Hz (15.6 Hz bins) while a 70 ms DTMF digit still fills a window
_BAND_HZ = (80.0, 4000.0)  # mains hum's fundamental and the air above the telephone band are left out
_LOBE_BINS = 3  # a Hann window's main lobe is +-2 bins; +-3 keeps the energy of a sinusoid between two bins
_SILENT = 1e-9  # mean square below this (-90 dBFS) is silence, never a tone
_N_SHORT = 512  # 32 ms, about one VAD frame: a DTMF digit is seen from its first whole frame
_SHORT_LOBE_BINS = 6  # a 512-point Hann window's main lobe is +-4 bins of the 1024-point grid; +-6 as above
# DTMF (ITU-T Q.23): one frequency of each group; Q.24 receivers accept +-1.8%, we allow +-2.5%
_DTMF_LOW_HZ = (697.0, 770.0, 852.0, 941.0)
_DTMF_HIGH_HZ = (1209.0, 1336.0, 1477.0, 1633.0)
_DTMF_TOLERANCE = 0.025


@dataclass(frozen=True)
class ToneOptions:
    """What counts as a steady tone. Validated in :meth:`validate`."""

    # the two strongest spectral peaks hold at least this share of the band's energy (generated DTMF and ringback:
    # 0.99 and above inside a tone; voiced speech of the shared set: above 0.98 in 4% of its frames, at 1024 points)
    min_share: float = 0.985
    # ... and the same peaks (within this many 15.6 Hz bins) held the frame before: speech that is that pure for one
    # frame has moved its pitch by the next
    max_drift_bins: int = 1
    # a DTMF digit (70 ms or more) is caught in the frame itself, without the frame before: one low-group and one
    # high-group frequency hold this share of the last 32 ms (speech never puts its two strongest peaks on both)
    min_dtmf_share: float = 0.9

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if not 0.5 <= self.min_share <= 1.0:
            raise ConfigError("tone min_share must be between 0.5 and 1")
        if not 0 <= self.max_drift_bins <= 4:
            raise ConfigError("tone max_drift_bins must be between 0 and 4")
        if not 0.5 <= self.min_dtmf_share <= 1.0:
            raise ConfigError("tone min_dtmf_share must be between 0.5 and 1")


class ToneDetector:
    """Say, frame by frame, whether the audio is a steady tone.

    Call :meth:`tones` with every frame of the stream in order, a chunk's frames at once (silent ones too: the
    verdict compares each frame with the one before), and treat a frame it flags as unvoiced. :meth:`is_tone` takes
    one frame.
    """

    def __init__(self, options: ToneOptions | None = None) -> None:
        self.options = options = options or ToneOptions()
        options.validate()
        self._window = np.hanning(_N_FFT)
        self._short_window = np.concatenate([np.zeros(_N_FFT - _N_SHORT), np.hanning(_N_SHORT)])
        freqs = np.fft.rfftfreq(_N_FFT, 1 / SAMPLE_RATE)
        self._band = slice(int(np.searchsorted(freqs, _BAND_HZ[0])), int(np.searchsorted(freqs, _BAND_HZ[1])) + 1)
        self._band_hz = tuple(float(hz) for hz in freqs[self._band])
        self._dtmf_bins = _dtmf_bins(self._band_hz)  # per band bin: whether it is a DTMF frequency of either group
        self._trailing = TrailingWindows(_N_FFT)
        self._previous: tuple[int, ...] = ()  # peak bins of the last frame that was pure, () if it was not

    def is_tone(self, frame: npt.NDArray[np.float32]) -> bool:
        """Analyse the next frame (float32 mono 16 kHz); True if it continues a steady tone of one or two sinusoids."""
        return bool(self.tones(np.asarray(frame).reshape(1, -1))[0])

    def tones(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.bool_]:
        """Analyse the next frames, shaped ``(n, frame_samples)``, float32 mono 16 kHz, in stream order: whether each
        continues a steady tone. The verdicts of :meth:`is_tone` frame by frame, from the same float operations: the
        spectra and the statistics over whole frames are taken for the chunk at once (one FFT call for a 100 ms
        chunk's three frames: numpy's per-call overhead, not the FFT, was most of the cost; issue 37), the peaks of
        each frame one by one."""
        n = len(frames)
        # 1. Each frame's analysis window is the last _N_FFT samples of the stream up to the frame's end.
        windows = self._trailing.of(frames)
        # 2. What each frame's verdict needs, for all at once (the mean square as np.mean takes it: a sum, a division).
        silent: list[bool] = (np.add.reduce(windows[:, -_N_SHORT:] ** 2, axis=1) / _N_SHORT < _SILENT).tolist()
        bands = self._band_power(windows, self._window)
        totals: list[float] = np.add.reduce(bands, axis=1).tolist()
        strongest: list[int] = bands.argmax(axis=1).tolist()
        # 3. Frame by frame: steady if the same one or two pure peaks (within max_drift_bins) held the frame before.
        drift = self.options.max_drift_bins
        verdicts = np.zeros(n, dtype=np.bool_)
        for i in range(n):
            if silent[i]:
                self._previous = ()
                continue
            peaks = _pure_peaks(bands[i], strongest[i], totals[i], _LOBE_BINS, self.options.min_share)
            steady = bool(peaks) and len(peaks) == len(self._previous)
            steady = steady and all(abs(a - b) <= drift for a, b in zip(peaks, self._previous, strict=True))
            self._previous = peaks
            # the second, short look is only for a DTMF digit: skipped unless the strongest frequency is one of its
            # (speech's strongest is nearly always below 697 Hz), which keeps most frames at one FFT
            verdicts[i] = steady or (self._dtmf_bins[strongest[i]] and self._is_dtmf(windows[i : i + 1]))
        return verdicts

    def _band_power(self, windows: npt.NDArray[np.float64], window: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        spectrum: npt.NDArray[np.float64] = np.abs(np.fft.rfft(windows * window, axis=1)) ** 2
        return spectrum[:, self._band]

    def _is_dtmf(self, window: npt.NDArray[np.float64]) -> bool:
        band = self._band_power(window, self._short_window)[0]
        total = float(np.add.reduce(band))
        peaks = _pure_peaks(band, int(band.argmax()), total, _SHORT_LOBE_BINS, self.options.min_dtmf_share)
        if len(peaks) != 2:
            return False
        low, high = (self._band_hz[k] for k in peaks)
        return _near(low, _DTMF_LOW_HZ) and _near(high, _DTMF_HIGH_HZ)


class TrailingWindows:
    """Each frame's analysis window: the last ``size`` samples of the stream up to the frame's end (zeros before the
    stream's start), for frames given in stream order, a chunk's at once. Used by the tone and music detectors."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._recent = np.zeros(size, dtype=np.float64)  # the last ``size`` samples, oldest first

    def of(self, frames: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
        """The windows of ``frames`` (shaped ``(n, frame_samples)``), shaped ``(n, size)``: a strided view, no copy."""
        n, length = frames.shape
        stream = np.concatenate([self._recent, np.asarray(frames, dtype=np.float64).reshape(-1)])
        step = stream.itemsize
        windows: npt.NDArray[np.float64] = np.ndarray(
            (n, self.size), np.float64, stream, offset=length * step, strides=(length * step, step)
        )
        self._recent = stream[-self.size :].copy()
        return windows


def _near(hz: float, nominal: tuple[float, ...]) -> bool:
    return any(abs(hz - f) <= _DTMF_TOLERANCE * f for f in nominal)


@functools.cache
def _dtmf_bins(band_hz: tuple[float, ...]) -> tuple[bool, ...]:
    """Per frequency of ``band_hz``: whether it is a DTMF one (of either group). Once per process, not per stream."""
    return tuple(_near(hz, _DTMF_LOW_HZ) or _near(hz, _DTMF_HIGH_HZ) for hz in band_hz)


def _pure_peaks(
    band: npt.NDArray[np.float64], strongest: int, total: float, lobe_bins: int, share: float
) -> tuple[int, ...]:
    """The band bins (ascending) of the one or two sinusoids that hold ``share`` of the energy of ``band`` (a power
    spectrum, left as it is; ``strongest`` is its argmax and ``total`` its sum); () if one or two do not."""
    if total <= 0.0:
        return ()
    rest = band.copy()
    held = 0.0
    peaks: list[int] = []
    k = strongest
    for _ in range(2):
        lobe = slice(max(0, k - lobe_bins), k + lobe_bins + 1)
        held += float(np.add.reduce(rest[lobe]))
        rest[lobe] = 0.0
        peaks.append(k)
        if held >= share * total:
            return tuple(sorted(peaks))
        k = int(rest.argmax())
    return ()
