"""ContainerInput alone: frames in, decoded audio shaped into transcripts out, the rate limit charged with what the
frames decode to, and nothing decoded before a fault lost."""

from __future__ import annotations

import numpy as np
import pytest

from streamer.core.container import ContainerEncoding, Samples
from streamer.core.errors import BadContainer, RateLimited, UnsupportedAudio
from streamer.server.container_input import ContainerInput
from streamer.server.ratelimit import AudioRateLimiter, RateLimitOptions
from tests.containers import decode_whole, encode
from tests.helpers import chunks, speech

KIB = 1024


class Sink:
    def __init__(self) -> None:
        self.runs: list[Samples] = []

    def __call__(self, samples: Samples, now: float) -> None:
        self.runs.append(samples)

    @property
    def frames(self) -> int:
        return sum(run.frames for run in self.runs)


def feed(
    transcripts: int | None,
    encoding: ContainerEncoding = ContainerEncoding.CONTAINER,
    rate_limit: RateLimitOptions | None = None,
) -> tuple[ContainerInput, Sink]:
    options = rate_limit or RateLimitOptions()
    sink = Sink()
    return ContainerInput(encoding, transcripts, options, AudioRateLimiter(options, 0.0), sink), sink


def stereo_wav() -> bytes:
    audio = speech()[: 2 * 16000]
    return encode(np.stack([audio, -audio]), 16000, "wav", "pcm_s16le")


def test_channels_are_mixed_down_for_one_transcript_or_kept_one_row_each() -> None:
    wav = stereo_wav()
    mixed, mixed_sink = feed(transcripts=1)
    split, split_sink = feed(transcripts=None)
    for frame in chunks(wav, KIB):
        mixed.receive(frame, 0.0)
        split.receive(frame, 0.0)
    assert mixed.end(0.0) is None and split.end(0.0) is None
    assert {run.channels for run in mixed_sink.runs} == {1} and {run.channels for run in split_sink.runs} == {2}
    whole = np.concatenate([run.audio for run in split_sink.runs], axis=1)
    np.testing.assert_allclose(whole, decode_whole(wav), atol=1e-6)  # every sample, in order
    np.testing.assert_allclose(np.concatenate([run.audio[0] for run in mixed_sink.runs]), 0.0, atol=1e-4)
    assert mixed.seconds == split.seconds == pytest.approx(2.0) and split.channels == 2


def test_a_container_with_other_channels_than_asked_is_unsupported_audio() -> None:
    two, sink = feed(transcripts=2)
    with pytest.raises(UnsupportedAudio, match="holds 1 channel"):
        for frame in chunks(encode(speech(), 16000, "webm"), KIB):
            two.receive(frame, 0.0)
    assert sink.frames == 0


def test_a_fault_hands_over_the_audio_before_it_first() -> None:
    data = bytearray(encode(speech(), 16000, "ogg"))
    data[data.index(b"OggS", len(data) // 2) + 40] ^= 0x01
    opus, sink = feed(transcripts=1, encoding=ContainerEncoding.OPUS)
    with pytest.raises(BadContainer, match="checksum"):
        for frame in chunks(bytes(data), KIB):
            opus.receive(frame, 0.0)
    assert sink.frames >= 0.45 * len(speech()) * 3  # 48 kHz
    assert opus.seconds == pytest.approx(sink.frames / 48000)
    assert opus.end(0.0) is None  # the fault was said once; nothing is left


def test_a_file_cut_short_is_said_at_the_end_after_its_audio() -> None:
    data = encode(speech(), 16000, "wav", "pcm_s16le")
    cut, sink = feed(transcripts=1)
    cut.receive(data[:-1], 0.0)  # half a sample short
    error = cut.end(0.0)
    assert isinstance(error, BadContainer) and "cut short" in error.message
    assert sink.frames == len(speech()) - 1


def test_the_rate_limit_is_charged_with_decoded_audio_and_a_refused_frame_reaches_no_one() -> None:
    limit = RateLimitOptions(max_rate=1.0, burst_seconds=1.0)
    wav = encode(speech()[: 2 * 16000], 16000, "wav", "pcm_s16le")
    limited, sink = feed(transcripts=1, rate_limit=limit)
    start = wav.index(b"data") + 8  # the samples' first byte
    limited.receive(wav[: start + 16000], 0.0)  # the header and 0.5 s
    with pytest.raises(RateLimited):
        limited.receive(wav[start + 16000 : start + 40000], 0.0)  # 0.75 s more at once: within a call, past the bucket
    assert sink.frames == 8000 and limited.seconds == 0.5


def test_a_restart_keeps_what_the_old_file_completed_and_takes_a_new_one() -> None:
    data = encode(speech(), 16000, "webm")
    restarted, sink = feed(transcripts=1, encoding=ContainerEncoding.OPUS)
    restarted.receive(data[: len(data) // 2], 0.0)
    restarted.restart(1.0)  # a recorder restarted on a new connection
    first = sink.frames
    for frame in chunks(data, KIB):
        restarted.receive(frame, 1.0)
    assert restarted.end(1.0) is None
    assert first > 0 and sink.frames - first == pytest.approx(len(speech()) * 3, abs=960)
