from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from streamer.core import audio
from streamer.core.audio import (
    AudioFormat,
    Encoding,
    Resampler,
    WireDecoder,
    decode_alaw,
    decode_mulaw,
    downmix,
    encode_alaw,
    encode_mulaw,
    resample,
)
from streamer.core.errors import MalformedMessage, UnsupportedAudio

ALL_BYTES = bytes(range(256))


def sine(freq: float, rate: int, seconds: float) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


@pytest.mark.parametrize(
    "fmt",
    [
        AudioFormat(sample_rate=7999),
        AudioFormat(sample_rate=96000),
        AudioFormat(channels=3),
        AudioFormat(encoding="opus"),  # type: ignore[arg-type]
    ],
)
def test_unsupported_formats_are_rejected_with_a_clear_message(fmt: AudioFormat) -> None:
    with pytest.raises(UnsupportedAudio, match="not supported"):
        fmt.validate()


def test_s16_odd_byte_is_carried_to_the_next_frame() -> None:
    pcm = (np.array([1000, -2000, 3000], dtype="<i2")).tobytes()
    dec = WireDecoder(AudioFormat())
    a = dec.decode(pcm[:3])
    b = dec.decode(pcm[3:])
    assert a.shape == (1, 1) and b.shape == (1, 2)
    np.testing.assert_allclose(np.concatenate([a[0], b[0]]) * 32768, [1000, -2000, 3000])
    assert dec.flush() == 0


def test_incomplete_stereo_frame_is_carried_and_flush_reports_dropped_bytes() -> None:
    frames = np.array([[1, 2], [3, 4], [5, 6]], dtype="<i2").tobytes()  # L/R interleaved
    dec = WireDecoder(AudioFormat(channels=2))
    out = [dec.decode(frames[i : i + 3]) for i in range(0, len(frames), 3)]
    both = np.concatenate(out, axis=1) * 32768
    np.testing.assert_allclose(both, [[1, 3, 5], [2, 4, 6]])
    dec.decode(b"\x01\x02\x03")
    assert dec.flush() == 3
    np.testing.assert_allclose(downmix(both / 32768) * 32768, [1.5, 3.5, 5.5])


def test_f32_nan_is_malformed() -> None:
    dec = WireDecoder(AudioFormat(encoding=Encoding.PCM_F32LE))
    ok = dec.decode(np.array([0.5, -0.25], dtype="<f4").tobytes())
    np.testing.assert_array_equal(ok[0], [0.5, -0.25])
    with pytest.raises(MalformedMessage):
        dec.decode(np.array([0.1, np.nan], dtype="<f4").tobytes())
    with pytest.raises(MalformedMessage):
        dec.decode(np.array([np.inf], dtype="<f4").tobytes())


@pytest.mark.parametrize(("encode", "decode"), [(encode_mulaw, decode_mulaw), (encode_alaw, decode_alaw)])
def test_g711_round_trip(encode, decode) -> None:  # type: ignore[no-untyped-def]
    # every code decodes to a value that encodes back to a code with the same value
    values = decode(ALL_BYTES)
    np.testing.assert_array_equal(decode(encode(values)), values)
    # speech-level signals survive with about 38 dB SNR (G.711's 8-bit companding)
    x = sine(440, 8000, 1.0)
    y = decode(encode(x))
    snr = 10 * np.log10(np.mean(x**2) / np.mean((x - y) ** 2))
    assert snr > 30


def test_g711_matches_the_reference_tables() -> None:
    # values from ITU-T G.711 / Sun g711.c
    assert decode_mulaw(b"\x00\x7f\x80\xff").tolist() == [-32124 / 32768, 0.0, 32124 / 32768, 0.0]
    assert decode_alaw(b"\xd5\x55\x2a\xaa").tolist() == [8 / 32768, -8 / 32768, -32256 / 32768, 32256 / 32768]
    assert encode_mulaw([0.0]) == b"\xff" and encode_alaw([0.0]) == b"\xd5"


def test_mulaw_wire_decoding() -> None:
    x = sine(300, 8000, 0.1)
    dec = WireDecoder(AudioFormat(encoding=Encoding.MULAW, sample_rate=8000))
    y = dec.decode(encode_mulaw(x))[0]
    assert np.max(np.abs(x - y)) < 0.02


def test_upsampling_keeps_the_frequency_with_high_snr() -> None:
    x = sine(1000, 8000, 1.0)
    y = resample(x, 8000, 16000)
    assert len(y) == 16000
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    assert np.argmax(spectrum) * 16000 / len(y) == pytest.approx(1000, abs=2)
    ideal = sine(1000, 16000, 1.0)
    err = (y - ideal)[200:-200]
    snr = 10 * np.log10(np.mean(ideal[200:-200] ** 2) / np.mean(err**2))
    assert snr > 60


def test_downsampling_removes_what_cannot_be_represented() -> None:
    alias = sine(10000, 48000, 1.0)  # above the 8 kHz Nyquist of the output
    assert np.sqrt(np.mean(resample(alias, 48000, 16000)[100:-100] ** 2)) < 1e-3  # edges: the abrupt start
    keep = resample(sine(3000, 48000, 1.0), 48000, 16000)
    assert np.sqrt(np.mean(keep[100:-100] ** 2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)


@pytest.mark.parametrize(
    ("rate_in", "rate_out"),
    [(8000, 16000), (44100, 16000), (48000, 16000), (22050, 16000), (16000, 16000), (11025, 16000)],
)
def test_streaming_equals_one_shot_with_exact_length(rate_in: int, rate_out: int) -> None:
    rng = np.random.default_rng(rate_in)
    x = rng.standard_normal(rate_in * 2 + 37).astype(np.float32) * 0.1
    whole = resample(x, rate_in, rate_out)
    assert len(whole) == round(len(x) * rate_out / rate_in)
    r = Resampler(rate_in, rate_out)
    parts, pos = [], 0
    while pos < len(x):
        n = int(rng.integers(0, 900))
        parts.append(r.process(x[pos : pos + n]))
        pos += n
    parts.append(r.flush())
    streamed = np.concatenate(parts)
    assert len(streamed) == len(whole)
    np.testing.assert_allclose(streamed, whole, atol=1e-6)


def test_identity_and_empty() -> None:
    x = sine(100, 16000, 0.01)
    np.testing.assert_array_equal(resample(x, 16000, 16000), x)
    assert len(resample(np.zeros(0, dtype=np.float32), 8000, 16000)) == 0
    assert len(resample(np.zeros(1, dtype=np.float32), 8000, 16000)) == 2


# --- issue 14: every input costs memory linear in its own size, with a small constant ---------------------------


def peak_bytes(run: Callable[[], object]) -> tuple[int, object]:
    """The most memory ``run`` had allocated at once (numpy reports its arrays to tracemalloc), and its result."""
    tracemalloc.start()
    try:
        result = run()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def resample_in_chunks(x: np.ndarray, rate_in: int, sizes: Iterator[int]) -> np.ndarray:
    r = Resampler(rate_in, 16000)
    parts, pos = [], 0
    while pos < len(x):
        n = next(sizes)
        parts.append(r.process(x[pos : pos + n]))
        pos += n
    parts.append(r.flush())
    return np.concatenate(parts)


@pytest.mark.parametrize("rate_in", [8000, 24000, 44100, 48000, 47999])  # 47999: taps computed per output, no table
def test_block_wise_resampling_equals_one_matrix_per_chunk(monkeypatch: pytest.MonkeyPatch, rate_in: int) -> None:
    rng = np.random.default_rng(rate_in)
    x = (rng.standard_normal(rate_in // 2 + 37) * 0.1).astype(np.float32)
    chunk_sizes = [int(n) for n in rng.integers(0, 3000, size=len(x))]
    # blocks larger than any chunk: each chunk is one matrix of every output's taps, as before the blocks
    monkeypatch.setattr(audio, "_BLOCK_OUTPUTS", 1 << 30)
    monkeypatch.setattr(audio, "_BLOCK_INPUTS", 1 << 30)
    one_matrix = resample_in_chunks(x, rate_in, iter(chunk_sizes))
    # tiny blocks that never line up with the chunks, nor with each other
    monkeypatch.setattr(audio, "_BLOCK_OUTPUTS", 7)
    monkeypatch.setattr(audio, "_BLOCK_INPUTS", 13)
    blocks = resample_in_chunks(x, rate_in, iter(chunk_sizes))
    assert len(blocks) == len(one_matrix) == round(len(x) * 16000 / rate_in)
    np.testing.assert_allclose(blocks, one_matrix, rtol=0, atol=1e-6)


@pytest.mark.parametrize("rate_in", [8000, 48000])
def test_resampling_a_long_chunk_needs_a_working_set_independent_of_its_length(rate_in: int) -> None:
    # a 480 KB mu-law frame is 60 s of 8 kHz audio: it once cost 840 MiB as one (outputs, taps) matrix
    extra = {}
    for seconds in (6, 60):
        x = np.zeros(rate_in * seconds, dtype=np.float32)
        peak, out = peak_bytes(lambda x=x: Resampler(rate_in, 16000).process(x))  # type: ignore[misc]
        assert isinstance(out, np.ndarray)
        extra[seconds] = peak - out.nbytes
    # 3 matrices of _BLOCK_OUTPUTS x (at most 104 taps) float64, plus the history: about 10 MiB
    assert extra[60] < 12 * 2**20
    assert abs(extra[60] - extra[6]) < 2**20


@pytest.mark.parametrize(
    ("encoding", "bytes_per_sample"),
    [(Encoding.MULAW, 1), (Encoding.ALAW, 1), (Encoding.PCM_S16LE, 2), (Encoding.PCM_F32LE, 4)],
)
def test_decoding_a_frame_allocates_only_its_result(encoding: Encoding, bytes_per_sample: int) -> None:
    frame = bytes(480_000)  # the largest binary frame /v1/listen takes is 1 MiB
    decoder = WireDecoder(AudioFormat(encoding=encoding, sample_rate=8000))
    peak, out = peak_bytes(lambda: decoder.decode(frame))
    assert isinstance(out, np.ndarray) and out.shape == (1, len(frame) // bytes_per_sample)
    assert peak <= out.nbytes + 256 * 1024  # numpy converts indices through a buffer of its own (64 KiB)
