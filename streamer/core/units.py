"""Units of audio and model time, defined once with their derivation.

Inside the code, stream time is an integer count of samples at :data:`SAMPLE_RATE`; seconds appear only on the
wire and in logs (see :func:`samples_to_seconds`).
"""

from __future__ import annotations

__all__ = [
    "HOP_LENGTH",
    "N_FFT",
    "N_FRAMES",
    "N_SAMPLES",
    "SAMPLES_PER_TOKEN",
    "SAMPLE_RATE",
    "TIME_PRECISION",
    "exact_div",
    "samples_to_seconds",
]


def exact_div(x: int, y: int) -> int:
    """Divide ``x`` by ``y``, raising if the division leaves a remainder."""
    if x % y:
        raise ValueError(f"{x} is not divisible by {y}")
    return x // y


SAMPLE_RATE = 16000  # Whisper's model rate (Hz); all stream time is counted in these samples
N_FFT = 400  # 25 ms analysis window
HOP_LENGTH = 160  # 10 ms between mel frames
N_SAMPLES = 30 * SAMPLE_RATE  # the encoder's fixed 30 s input span: 480000 samples
N_FRAMES = exact_div(N_SAMPLES, HOP_LENGTH)  # 3000 mel frames in a window
SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # the conv stride of 2 makes one encoder position per 20 ms: 320 samples
TIME_PRECISION = SAMPLES_PER_TOKEN / SAMPLE_RATE  # 0.02 s (50 encoder positions per second): a timestamp token's step


def samples_to_seconds(samples: int) -> float:
    """Stream time in seconds for the wire and logs."""
    return samples / SAMPLE_RATE
