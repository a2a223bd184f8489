"""Units of audio and model time, defined once with their derivation.

Inside the code, stream time is an integer count of samples at :data:`SAMPLE_RATE`; seconds appear only on the
wire and in logs (see :func:`samples_to_seconds`).
"""

from __future__ import annotations

__all__ = [
    "CHUNK_SECONDS",
    "FRAMES_PER_SECOND",
    "HOP_LENGTH",
    "N_FFT",
    "N_FRAMES",
    "N_MELS",
    "N_SAMPLES",
    "SAMPLES_PER_TOKEN",
    "SAMPLE_RATE",
    "TIME_PRECISION",
    "TOKENS_PER_SECOND",
    "exact_div",
    "samples_to_seconds",
    "seconds_to_samples",
]


def exact_div(x: int, y: int) -> int:
    """Divide ``x`` by ``y``, raising if the division leaves a remainder."""
    if x % y:
        raise ValueError(f"{x} is not divisible by {y}")
    return x // y


SAMPLE_RATE = 16000  # Whisper's model rate (Hz); all stream time is counted in these samples
N_FFT = 400  # 25 ms analysis window
HOP_LENGTH = 160  # 10 ms between mel frames
N_MELS = 80  # mel bins of tiny/base/small/medium/large-v2
CHUNK_SECONDS = 30  # the encoder's fixed input span
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE  # 480000 samples in a 30 s window
N_FRAMES = exact_div(N_SAMPLES, HOP_LENGTH)  # 3000 mel frames in a window
SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # the conv stride of 2 makes one encoder position per 20 ms: 320 samples
FRAMES_PER_SECOND = exact_div(SAMPLE_RATE, HOP_LENGTH)  # 100 mel frames per second
TOKENS_PER_SECOND = exact_div(SAMPLE_RATE, SAMPLES_PER_TOKEN)  # 50 encoder positions per second
TIME_PRECISION = 1 / TOKENS_PER_SECOND  # 0.02 s: the resolution of a timestamp token


def samples_to_seconds(samples: int) -> float:
    """Stream time in seconds for the wire and logs."""
    return samples / SAMPLE_RATE


def seconds_to_samples(seconds: float) -> int:
    """The nearest whole sample to ``seconds`` of stream time."""
    return round(seconds * SAMPLE_RATE)
