from __future__ import annotations

import numpy as np

from streamer.bench.narrowband import narrowband


def test_narrowband_keeps_length_and_speech_band_and_removes_the_upper_band() -> None:
    t = np.arange(16000) / 16000
    low = 0.3 * np.sin(2 * np.pi * 1000 * t)
    high = 0.3 * np.sin(2 * np.pi * 6000 * t)
    out = narrowband((low + high).astype(np.float32))
    assert out.shape == (16000,)
    spectrum = np.abs(np.fft.rfft(out[1000:-1000]))
    freqs = np.fft.rfftfreq(14000, 1 / 16000)
    at = lambda f: spectrum[np.argmin(np.abs(freqs - f))]  # noqa: E731
    assert at(1000) > 100 * at(6000)  # the 6 kHz tone is gone: telephone band ends at 4 kHz
    # G.711 keeps the speech band to within its companding noise
    assert np.corrcoef(out[1000:-1000], low[1000:-1000])[0, 1] > 0.99
