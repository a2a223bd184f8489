"""Wire audio: formats, stateful frame decoding, G.711 codecs and resampling to the model rate.

Sans-I/O: every function takes and returns arrays. A session builds one :class:`WireDecoder` and one
:class:`Resampler` per stream, feeds each binary frame through both, and hands 16 kHz mono float32 to the core.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from streamer.core.errors import MalformedMessage, UnsupportedAudio

__all__ = [
    "MAX_SAMPLE_RATE",
    "MIN_SAMPLE_RATE",
    "AudioFormat",
    "Encoding",
    "Resampler",
    "WireDecoder",
    "decode_alaw",
    "decode_mulaw",
    "downmix",
    "encode_alaw",
    "encode_mulaw",
    "resample",
]

AudioArray = npt.NDArray[np.float32]

MIN_SAMPLE_RATE = 8000  # narrowband telephony
MAX_SAMPLE_RATE = 48000  # studio rate; anything above is pointless for a 16 kHz model


class Encoding(StrEnum):
    """Sample encodings accepted on the wire (little-endian, interleaved when stereo)."""

    PCM_S16LE = "pcm_s16le"
    PCM_F32LE = "pcm_f32le"
    MULAW = "mulaw"  # G.711 mu-law, 8 bits per sample
    ALAW = "alaw"  # G.711 A-law, 8 bits per sample

    @property
    def bytes_per_sample(self) -> int:
        return {Encoding.PCM_S16LE: 2, Encoding.PCM_F32LE: 4, Encoding.MULAW: 1, Encoding.ALAW: 1}[self]


@dataclass(frozen=True)
class AudioFormat:
    """What the client says it will send. Validated in :meth:`validate`."""

    # how each sample is encoded
    encoding: Encoding = Encoding.PCM_S16LE
    # samples per second per channel, MIN_SAMPLE_RATE..MAX_SAMPLE_RATE
    sample_rate: int = 16000
    # 1 (mono) or 2 (interleaved stereo)
    channels: int = 1

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.UnsupportedAudio` naming the first field the server cannot accept."""
        if not isinstance(self.encoding, Encoding):
            allowed = ", ".join(e.value for e in Encoding)
            raise UnsupportedAudio(f"encoding {self.encoding!r} is not supported; use one of: {allowed}")
        if not isinstance(self.sample_rate, int) or not MIN_SAMPLE_RATE <= self.sample_rate <= MAX_SAMPLE_RATE:
            raise UnsupportedAudio(
                f"sample_rate {self.sample_rate!r} is not supported; use an integer from "
                f"{MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE} Hz"
            )
        if self.channels not in (1, 2):
            raise UnsupportedAudio(f"channels {self.channels!r} is not supported; use 1 or 2")

    @property
    def frame_bytes(self) -> int:
        """Bytes in one interleaved frame (one sample of every channel)."""
        return self.encoding.bytes_per_sample * self.channels


# --- G.711 (ITU-T G.711, tables as in the Sun Microsystems reference g711.c) --------------------------------------

_MULAW_BIAS = 0x84  # 132: added before the segment search so that every segment has the same shape
_MULAW_CLIP = 32635


def _mulaw_decode_table() -> npt.NDArray[np.int16]:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = (((mantissa << 3) + _MULAW_BIAS) << exponent) - _MULAW_BIAS
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_decode_table() -> npt.NDArray[np.int16]:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (a >> 4) & 0x07
    mantissa = a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    # in A-law the sign bit set means positive
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


_MULAW_TABLE = _mulaw_decode_table()
_ALAW_TABLE = _alaw_decode_table()
# the same tables as float32 in [-1, 1) (dividing by 2**15 is exact): decoding is then one lookup, whose result is
# the only allocation, 4 bytes per byte of input (issue 14: each input costs memory linear in its size)
_MULAW_FLOAT = _MULAW_TABLE.astype(np.float32) / np.float32(32768.0)
_ALAW_FLOAT = _ALAW_TABLE.astype(np.float32) / np.float32(32768.0)


def _to_int16(x: npt.ArrayLike) -> npt.NDArray[np.int32]:
    a = np.asarray(x, dtype=np.float64)
    return np.clip(np.round(a * 32768.0), -32768, 32767).astype(np.int32)


def decode_mulaw(data: bytes) -> AudioArray:
    """G.711 mu-law bytes to float32 in [-1, 1)."""
    decoded: AudioArray = _MULAW_FLOAT[np.frombuffer(data, dtype=np.uint8)]
    return decoded


def decode_alaw(data: bytes) -> AudioArray:
    """G.711 A-law bytes to float32 in [-1, 1)."""
    decoded: AudioArray = _ALAW_FLOAT[np.frombuffer(data, dtype=np.uint8)]
    return decoded


def encode_mulaw(x: npt.ArrayLike) -> bytes:
    """Float samples in [-1, 1] to G.711 mu-law bytes (values outside are clipped)."""
    pcm = _to_int16(x)
    sign = np.where(pcm < 0, 0x80, 0x00)
    magnitude = np.minimum(np.abs(pcm), _MULAW_CLIP) + _MULAW_BIAS
    # exponent = position of the highest set bit among bits 7..14
    exponent = np.clip(np.floor(np.log2(magnitude)).astype(np.int32) - 7, 0, 7)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    code = np.asarray(~(sign | (exponent << 4) | mantissa) & 0xFF, dtype=np.uint8)
    return code.tobytes()


def encode_alaw(x: npt.ArrayLike) -> bytes:
    """Float samples in [-1, 1] to G.711 A-law bytes (values outside are clipped)."""
    pcm = _to_int16(x) >> 3  # A-law works on 13-bit samples
    positive = pcm >= 0
    mask = np.where(positive, 0xD5, 0x55)
    magnitude = np.where(positive, pcm, -pcm - 1)
    segment_ends = np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF])
    segment = np.searchsorted(segment_ends, magnitude, side="left")
    shift = np.where(segment < 2, 1, segment)
    code = np.where(
        segment >= 8,
        0x7F,
        (np.minimum(segment, 7) << 4) | ((magnitude >> np.minimum(shift, 7)) & 0x0F),
    )
    return ((code ^ mask) & 0xFF).astype(np.uint8).tobytes()


# --- wire frames --------------------------------------------------------------------------------------------------


class WireDecoder:
    """Decode binary frames of any size into float32 samples per channel, at the source rate.

    Call :meth:`decode` for every binary frame in arrival order; a trailing incomplete frame (an odd byte of 16-bit
    audio, half of a stereo frame) is carried over and completed by the next call. At end of stream call
    :meth:`flush`: it returns how many carried bytes could not be decoded, which the session reports.
    """

    def __init__(self, fmt: AudioFormat) -> None:
        fmt.validate()
        self.format = fmt
        self._carry = b""

    def decode(self, data: bytes) -> AudioArray:
        """Return an array of shape ``(channels, n)``; ``n`` may be 0. Memory: the result, plus a copy of the frame
        only when an incomplete frame was carried over.

        Raises :class:`~streamer.core.errors.MalformedMessage` if float samples are NaN or infinite.
        """
        fmt = self.format
        buf = self._carry + bytes(data) if self._carry else bytes(data)
        usable = len(buf) - len(buf) % fmt.frame_bytes
        self._carry = buf[usable:]
        body = buf[:usable]
        # each branch allocates its float32 result and nothing else of the frame's size: 4 bytes per sample
        if fmt.encoding is Encoding.PCM_S16LE:
            flat = np.frombuffer(body, dtype="<i2").astype(np.float32)
            flat /= np.float32(32768.0)
        elif fmt.encoding is Encoding.PCM_F32LE:
            flat = np.frombuffer(body, dtype="<f4").astype(np.float32)
            # min and max propagate NaN and hold any infinity, without a mask of the frame's size
            if flat.size and not (np.isfinite(flat.min()) and np.isfinite(flat.max())):
                self._carry = b""
                raise MalformedMessage("float32 audio contains NaN or infinite samples")
        elif fmt.encoding is Encoding.MULAW:
            flat = decode_mulaw(body)
        else:
            flat = decode_alaw(body)
        return np.ascontiguousarray(flat.reshape(-1, fmt.channels).T, dtype=np.float32)

    def flush(self) -> int:
        """End of stream: drop the carried partial frame and return its size in bytes (0 when none)."""
        dropped = len(self._carry)
        self._carry = b""
        return dropped


def downmix(channels: AudioArray) -> AudioArray:
    """Average a ``(channels, n)`` array to mono ``(n,)``."""
    if channels.ndim == 1:
        return channels.astype(np.float32, copy=False)
    return np.asarray(channels.mean(axis=0), dtype=np.float32)


# --- resampling ---------------------------------------------------------------------------------------------------

_ZERO_CROSSINGS = 16  # sinc lobes each side of the centre: ~80 dB stop band with the Kaiser window below
_ROLLOFF = 0.94  # pass band edge as a fraction of the lower Nyquist frequency, leaves room for the transition
_KAISER_BETA = 8.6
_TABLE_MAX_PHASES = 4096  # precompute per-phase filters when the reduced ratio has at most this many phases
# Working-set bounds of Resampler.process, whatever the chunk's length (issue 14). Outputs are evaluated
# _BLOCK_OUTPUTS at a time, each block as three (outputs, 2W) float64 matrices (indices, input samples, taps): into
# 16 kHz 2W is at most 104 (from 48 kHz), so 3 * 4096 * 104 * 8 bytes = 10 MiB. Input joins the float64 history
# _BLOCK_INPUTS at a time (64 KiB of it), so the history never holds a whole large chunk.
_BLOCK_OUTPUTS = 4096
_BLOCK_INPUTS = 8192


@dataclass(frozen=True)
class _Filter:
    up: int  # L: output samples per `down` input samples (reduced ratio)
    down: int  # M
    half_width: int  # W: input samples each side of an output instant
    cutoff: float  # relative to the input Nyquist
    table: npt.NDArray[np.float64] | None  # (up, 2W) taps per phase, or None to compute on the fly

    def taps(self, phases: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Taps for the output instants at fractional offsets ``phase / up`` past an input sample."""
        if self.table is not None:
            return self.table[phases]
        return _kernel(phases.astype(np.float64) / self.up, self.half_width, self.cutoff)


def _kernel(frac: npt.NDArray[np.float64], half_width: int, cutoff: float) -> npt.NDArray[np.float64]:
    # tap j multiplies input sample (base - W + 1 + j); its distance from the output instant base + frac:
    offsets = np.arange(-half_width + 1, half_width + 1, dtype=np.float64)
    d = frac[:, None] - offsets[None, :]
    ratio = np.clip(d / (half_width + 1), -1.0, 1.0)
    window = np.i0(_KAISER_BETA * np.sqrt(1.0 - ratio * ratio)) / np.i0(_KAISER_BETA)
    taps: npt.NDArray[np.float64] = cutoff * np.sinc(cutoff * d) * window
    return taps


@functools.lru_cache(maxsize=32)
def _filter(rate_in: int, rate_out: int) -> _Filter:
    g = math.gcd(rate_in, rate_out)
    up, down = rate_out // g, rate_in // g
    cutoff = min(1.0, up / down) * _ROLLOFF
    half_width = math.ceil(_ZERO_CROSSINGS / cutoff)
    table = None
    if up <= _TABLE_MAX_PHASES:
        table = _kernel(np.arange(up, dtype=np.float64) / up, half_width, cutoff)
    return _Filter(up, down, half_width, cutoff, table)


class Resampler:
    """Streaming band-limited resampler (Kaiser-windowed sinc, evaluated per polyphase branch).

    Feed chunks of any size to :meth:`process` and call :meth:`flush` once at the end. The concatenated output equals
    :func:`resample` of the concatenated input, and has exactly ``round(n_in * rate_out / rate_in)`` samples.
    Output sample ``k`` is the input signal at time ``k / rate_out``; latency is a few milliseconds of input (the
    filter's half width).
    """

    def __init__(self, rate_in: int, rate_out: int) -> None:
        if rate_in <= 0 or rate_out <= 0:
            raise ValueError("sample rates must be positive")
        self.rate_in = rate_in
        self.rate_out = rate_out
        self._identity = rate_in == rate_out
        self._filter = _filter(rate_in, rate_out)
        w = self._filter.half_width
        # input history: absolute input index of _history[0] is _history_start (negative indices are zeros)
        self._history = np.zeros(w, dtype=np.float64)
        self._history_start = -w
        self._received = 0  # input samples received
        self._emitted = 0  # output samples emitted
        self._flushed = False

    def process(self, chunk: npt.ArrayLike) -> AudioArray:
        """Resample the next chunk; returns the output samples that are now fully determined (possibly none).

        Memory: the returned array, plus a working set bounded by :data:`_BLOCK_INPUTS` and :data:`_BLOCK_OUTPUTS`
        whatever the chunk's length (issue 14: a chunk was once one matrix of every output's taps, +840 MiB for one
        60 s mu-law frame)."""
        if self._flushed:
            raise ValueError("Resampler.process() after flush()")
        x = np.asarray(chunk, dtype=np.float32).reshape(-1)
        if self._identity:
            self._received += x.size
            self._emitted += x.size
            return x.copy()
        out = np.empty(self._ready(self._received + x.size) - self._emitted, dtype=np.float32)
        written = 0
        for start in range(0, x.size, _BLOCK_INPUTS):
            piece = x[start : start + _BLOCK_INPUTS]
            self._append(piece)
            self._received += piece.size
            written += self._emit_until(self._ready(self._received), out[written:])
        return out

    def flush(self) -> AudioArray:
        """End of input: return the remaining output (the input is padded with silence)."""
        if self._flushed:
            return np.zeros(0, dtype=np.float32)
        self._flushed = True
        if self._identity:
            return np.zeros(0, dtype=np.float32)
        self._append(np.zeros(self._filter.half_width + 1, dtype=np.float32))
        out = np.empty(self._total_out(self._received) - self._emitted, dtype=np.float32)
        self._emit_until(self._total_out(self._received), out)
        return out

    def _ready(self, n_in: int) -> int:
        """How many outputs ``n_in`` input samples determine: output k needs input up to floor(k * M / L) + W."""
        f = self._filter
        last_input = n_in - 1
        limit = ((last_input - f.half_width + 1) * f.up - 1) // f.down + 1 if last_input >= f.half_width else 0
        return max(self._emitted, min(limit, self._total_out(n_in)))

    def _total_out(self, n_in: int) -> int:
        # round(n_in * L / M), halves rounded up, in integers
        f = self._filter
        return (2 * n_in * f.up + f.down) // (2 * f.down)

    def _append(self, piece: AudioArray) -> None:
        # one allocation for the kept history and the new samples (np.concatenate of a float64 copy needs two)
        history = np.empty(len(self._history) + piece.size, dtype=np.float64)
        history[: len(self._history)] = self._history
        history[len(self._history) :] = piece
        self._history = history

    def _emit_until(self, limit: int, out: AudioArray) -> int:
        """Write outputs ``_emitted .. limit`` (``limit >= _emitted``) to the start of ``out``; return how many."""
        f = self._filter
        n = limit - self._emitted
        taps = np.arange(2 * f.half_width)
        # three (outputs, 2W) matrices per block (indices, input samples, taps): evaluated _BLOCK_OUTPUTS at a time,
        # every output is computed exactly as from one matrix, within a bounded working set
        for block_start in range(0, n, _BLOCK_OUTPUTS):
            stop = min(limit, self._emitted + block_start + _BLOCK_OUTPUTS)
            k = np.arange(self._emitted + block_start, stop, dtype=np.int64)
            base = (k * f.down) // f.up
            phase = (k * f.down) % f.up
            first = base - f.half_width + 1 - self._history_start  # index into history of each output's first tap
            idx = first[:, None] + taps[None, :]
            out[block_start : block_start + k.size] = np.einsum("ij,ij->i", self._history[idx], f.taps(phase))
        self._emitted = limit
        # drop history no future output needs
        next_base = (self._emitted * f.down) // f.up
        keep_from = next_base - f.half_width + 1 - self._history_start
        if keep_from > 0:
            self._history = self._history[keep_from:]
            self._history_start += keep_from
        return n


def resample(x: npt.ArrayLike, rate_in: int, rate_out: int) -> AudioArray:
    """Resample a whole mono signal; ``len(out) == round(len(x) * rate_out / rate_in)``."""
    r = Resampler(rate_in, rate_out)
    head = r.process(x)
    tail = r.flush()
    return np.concatenate([head, tail]).astype(np.float32, copy=False)
