"""Steady-tone detection: telephone signalling tones are not speech, however voiced they look (issue 16).

Sans-I/O: :class:`ToneDetector` takes the voice activity detector's frames one by one (16 kHz float32, any frame
length) and says for each whether it is a steady tone. The VAD treats such a frame as unvoiced, so a tone never
starts or prolongs a speech span and never reaches the engine (tiny.en reads a -19 dBFS ringback as "Beep").

What a steady tone is here: one or two sinusoids that hold nearly all of the frame's energy between 80 and 4000 Hz
(the telephone band and a little more), at the same frequencies as in the frame before. That covers DTMF digits
(ITU-T Q.23: one low-group and one high-group frequency), call-progress tones (ringback 440+480 Hz, dial 350+440 Hz,
busy 480+620 Hz, the 400+450 Hz and 425 Hz tones of other countries), fax and modem calling tones (1100 Hz CNG,
2100 Hz CED) and test tones, without a table of frequencies. Voiced speech is harmonic: even a low voice whose first
harmonic dominates a vowel keeps a few percent of its energy in other harmonics and in the formants above, and its
pitch moves from frame to frame; the measurements behind the thresholds are in :class:`ToneOptions`.

Cost: one 1024-point real FFT per frame (a second, shorter look when the strongest frequency is a DTMF one) and a
bounded buffer of the last 1024 samples, so CPU per stream is linear in the audio and memory constant in its length.

Music is not claimed: notes are not pure (a guitar's strings and body fill the band with partials), and no
spectral-persistence, modulation or tilt measure tried kept all of the shared real speech while rejecting the
shared guitar's music. The model writes no word for it (docs/operations.md, "Voice activity detection").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamer.core.errors import ConfigError
from streamer.core.units import SAMPLE_RATE

__all__ = ["ToneDetector", "ToneOptions"]

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

    Call :meth:`is_tone` with every frame of the stream in order (silent ones too: the verdict compares each frame
    with the one before) and treat a frame it flags as unvoiced.
    """

    def __init__(self, options: ToneOptions | None = None) -> None:
        self.options = options = options or ToneOptions()
        options.validate()
        self._window = np.hanning(_N_FFT)
        self._short_window = np.concatenate([np.zeros(_N_FFT - _N_SHORT), np.hanning(_N_SHORT)])
        freqs = np.fft.rfftfreq(_N_FFT, 1 / SAMPLE_RATE)
        self._band = slice(int(np.searchsorted(freqs, _BAND_HZ[0])), int(np.searchsorted(freqs, _BAND_HZ[1])) + 1)
        self._band_hz = freqs[self._band]
        self._recent = np.zeros(_N_FFT, dtype=np.float64)  # the last _N_FFT samples, oldest first
        self._previous: tuple[int, ...] = ()  # peak bins of the last frame that was pure, () if it was not

    def is_tone(self, frame: npt.NDArray[np.float32]) -> bool:
        """Analyse the next frame (float32 mono 16 kHz); True if it continues a steady tone of one or two sinusoids."""
        x = np.asarray(frame, dtype=np.float64).reshape(-1)[-_N_FFT:]
        self._recent = np.concatenate([self._recent[x.size :], x])
        if float(np.mean(self._recent[-_N_SHORT:] ** 2)) < _SILENT:
            self._previous = ()
            return False
        band = self._band_power(self._window)
        peaks = _pure_peaks(band, _LOBE_BINS, self.options.min_share)
        drift = self.options.max_drift_bins
        steady = bool(peaks) and len(peaks) == len(self._previous)
        steady = steady and all(abs(a - b) <= drift for a, b in zip(peaks, self._previous, strict=True))
        self._previous = peaks
        # the second, short look is only for a DTMF digit: skipped unless the strongest frequency is one of its
        # (speech's strongest is nearly always below 697 Hz), which keeps most frames at one FFT
        return steady or (_is_dtmf_hz(float(self._band_hz[int(np.argmax(band))])) and self._is_dtmf())

    def _band_power(self, window: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        spectrum: npt.NDArray[np.float64] = np.abs(np.fft.rfft(self._recent * window)) ** 2
        return spectrum[self._band]

    def _is_dtmf(self) -> bool:
        peaks = _pure_peaks(self._band_power(self._short_window), _SHORT_LOBE_BINS, self.options.min_dtmf_share)
        if len(peaks) != 2:
            return False
        low, high = (float(self._band_hz[k]) for k in peaks)
        return _near(low, _DTMF_LOW_HZ) and _near(high, _DTMF_HIGH_HZ)


def _near(hz: float, nominal: tuple[float, ...]) -> bool:
    return any(abs(hz - f) <= _DTMF_TOLERANCE * f for f in nominal)


def _is_dtmf_hz(hz: float) -> bool:
    return _near(hz, _DTMF_LOW_HZ) or _near(hz, _DTMF_HIGH_HZ)


def _pure_peaks(band: npt.NDArray[np.float64], lobe_bins: int, share: float) -> tuple[int, ...]:
    """The band bins (ascending) of the one or two sinusoids that hold ``share`` of the energy of ``band`` (a power
    spectrum, left as it is); () if one or two do not."""
    rest = band.copy()
    total = float(rest.sum())
    if total <= 0.0:
        return ()
    held = 0.0
    peaks: list[int] = []
    for _ in range(2):
        k = int(np.argmax(rest))
        lobe = slice(max(0, k - lobe_bins), k + lobe_bins + 1)
        held += float(rest[lobe].sum())
        rest[lobe] = 0.0
        peaks.append(k)
        if held >= share * total:
            return tuple(sorted(peaks))
    return ()
