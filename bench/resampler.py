"""Today's resampler (streamer.core.audio.Resampler) against soxr, side by side in one run (issue 14).

Run: ``python bench/resampler.py`` with soxr importable (``pip install soxr``). Prints, per rate into 16 kHz:
speed (input samples per second, fed as 20 ms chunks as the sessions do, and as one 60 s chunk), pass-band ripple
(gain of tones from 100 Hz to 85 % of the lower Nyquist frequency), the level of what must be removed (tones between
the output's Nyquist frequency and the input's, for downsampling: aliases; for upsampling: images above the input's
Nyquist frequency), the misalignment of its output (cross-correlation of a chirp against the ideal output, in
samples), and how much audio it holds back while streaming 20 ms chunks (latency added to every transcript).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from streamer.core.audio import Resampler

Array = npt.NDArray[np.float32]
OUT = 16000
RATES = (8000, 24000, 44100, 48000)
SECONDS = 60


def ours(rate: int) -> Callable[[Array, bool], Array]:
    r = Resampler(rate, OUT)
    return lambda x, last: np.concatenate([r.process(x), r.flush()]) if last else r.process(x)


def soxr_stream(rate: int, quality: str) -> Callable[[Array, bool], Array]:
    try:
        import soxr
    except ImportError:
        raise SystemExit("this comparison needs soxr: pip install soxr") from None

    s = soxr.ResampleStream(rate, OUT, 1, dtype="float32", quality=quality)
    return lambda x, last: np.asarray(s.resample_chunk(x, last=last), dtype=np.float32)


def run(make: Callable[[], Callable[[Array, bool], Array]], x: Array, chunk: int) -> Array:
    feed = make()
    parts = [feed(x[i : i + chunk], i + chunk >= len(x)) for i in range(0, len(x), chunk)]
    return np.concatenate(parts)


def speed(make: Callable[[], Callable[[Array, bool], Array]], x: Array, chunk: int) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        run(make, x, chunk)
        best = min(best, time.perf_counter() - t)
    return len(x) / best


def tone_gain_db(make: Callable[[], Callable[[Array, bool], Array]], rate: int, freq: float) -> float:
    n = rate  # 1 s
    x = (0.5 * np.sin(2 * np.pi * freq * np.arange(n) / rate)).astype(np.float32)
    y = run(make, x, len(x))[OUT // 10 : -OUT // 10]  # edges: the abrupt start and end
    rms = float(np.sqrt(np.mean(y.astype(np.float64) ** 2)))
    return 20 * np.log10(max(rms, 1e-12) / (0.5 / np.sqrt(2)))


def delay(make: Callable[[], Callable[[Array, bool], Array]], rate: int) -> int:
    t_in = np.arange(rate) / rate
    t_out = np.arange(OUT) / OUT
    top = 0.45 * min(rate, OUT)
    chirp = lambda t: np.sin(2 * np.pi * (50 * t + (top - 50) / 2 * t * t))  # noqa: E731
    y = run(make, chirp(t_in).astype(np.float32), rate // 50)[:OUT]
    ideal = chirp(t_out)
    lags = range(-64, 65)
    return max(lags, key=lambda lag: float(np.dot(np.roll(y, -lag), ideal)))


def held_back_ms(make: Callable[[], Callable[[Array, bool], Array]], rate: int) -> float:
    feed = make()
    chunk = np.zeros(rate // 50, dtype=np.float32)
    out = sum(len(feed(chunk, False)) for _ in range(50))  # 1 s in 20 ms chunks, not flushed
    return (OUT - out) * 1000 / OUT


def main() -> None:
    makers: dict[str, Callable[[int], Callable[[], Callable[[Array, bool], Array]]]] = {
        "ours": lambda rate: lambda: ours(rate),
        "soxr HQ": lambda rate: lambda: soxr_stream(rate, "HQ"),
        "soxr VHQ": lambda rate: lambda: soxr_stream(rate, "VHQ"),
    }
    print("rate   resampler  Msamples/s(20ms) Msamples/s(60s) ripple_dB  reject_dB  delay  held_ms")
    for rate in RATES:
        rng = np.random.default_rng(rate)
        x = (rng.standard_normal(rate * SECONDS) * 0.1).astype(np.float32)
        nyq = min(rate, OUT) / 2
        passband = np.linspace(100, 0.85 * nyq, 12)
        # what must not come through: for downsampling, input tones above the output's Nyquist frequency (they
        # would alias); for upsampling, the images of in-band tones above the input's Nyquist frequency
        for name, maker in makers.items():
            make = maker(rate)
            s20 = speed(make, x[: rate * 10], rate // 50) / 1e6
            s60 = speed(make, x, len(x)) / 1e6
            gains = [tone_gain_db(make, rate, f) for f in passband]
            ripple = max(gains) - min(gains)
            if rate > OUT:
                reject = max(tone_gain_db(make, rate, f) for f in np.linspace(OUT / 2 * 1.1, rate / 2 * 0.95, 8))
            else:
                reject = max(_image_db(make, rate, f) for f in np.linspace(0.1 * nyq, 0.85 * nyq, 8))
            print(
                f"{rate:<6} {name:<10} {s20:16.2f} {s60:15.2f} {ripple:9.3f} {reject:10.1f} {delay(make, rate):6d} "
                f"{held_back_ms(make, rate):8.2f}"
            )


def _image_db(make: Callable[[], Callable[[Array, bool], Array]], rate: int, freq: float) -> float:
    # energy of the output above the input's Nyquist frequency, relative to the tone
    x = (0.5 * np.sin(2 * np.pi * freq * np.arange(rate) / rate)).astype(np.float32)
    y = run(make, x, len(x))[OUT // 10 : -OUT // 10].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y)))) ** 2
    freqs = np.fft.rfftfreq(len(y), 1 / OUT)
    image = spectrum[freqs > rate / 2 * 1.05].sum()
    return float(10 * np.log10(max(image, 1e-30) / spectrum.sum()))


if __name__ == "__main__":
    main()
