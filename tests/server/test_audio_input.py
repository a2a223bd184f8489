"""The one frame intake (:mod:`streamer.server.audio_input`): the frame size limit, the rate limit charged before any
decoding, raw samples shaped into the stream's transcripts, and a resumed stream's clock."""

from __future__ import annotations

import numpy as np
import pytest

from streamer.core.audio import AudioFormat
from streamer.core.container import ContainerEncoding, Samples
from streamer.core.errors import FrameTooLarge, InvalidState, RateLimited
from streamer.server.audio_input import RawInput, check_frame_size, open_audio_input
from streamer.server.container_input import ContainerInput
from streamer.server.ratelimit import AudioRateLimiter, RateLimitOptions

STEREO = AudioFormat(sample_rate=8000, channels=2)


class Sink:
    def __init__(self) -> None:
        self.received: list[Samples] = []

    def __call__(self, samples: Samples, now: float) -> None:
        self.received.append(samples)


def stereo_frames(frames: int) -> bytes:
    left = np.full(frames, 1000, dtype="<i2")
    right = np.full(frames, 3000, dtype="<i2")
    return np.column_stack([left, right]).tobytes()


def raw(transcripts: int, options: RateLimitOptions | None = None) -> tuple[RawInput, Sink]:
    sink = Sink()
    limiter = AudioRateLimiter(options or RateLimitOptions(), 0.0)
    audio = open_audio_input(STEREO, None, transcripts, options or RateLimitOptions(), limiter, sink)
    assert isinstance(audio, RawInput)
    return audio, sink


def test_a_frame_over_the_limit_is_refused_before_anything_reads_it() -> None:
    check_frame_size(b"x" * 100, 100)
    with pytest.raises(FrameTooLarge, match="at most 100 bytes, this one had 101"):
        check_frame_size(b"x" * 101, 100)


def test_raw_frames_reach_the_sink_one_row_per_channel_or_mixed_down_for_one() -> None:
    both, sink = raw(transcripts=2)
    both.receive(stereo_frames(800), 0.0)
    [samples] = sink.received
    assert samples.audio.shape == (2, 800) and samples.sample_rate == 8000
    assert samples.audio[0, 0] < samples.audio[1, 0]
    mixed, sink = raw(transcripts=1)
    mixed.receive(stereo_frames(800), 0.0)
    [samples] = sink.received
    assert samples.audio.shape == (1, 800)
    assert samples.audio[0, 0] == pytest.approx((1000 + 3000) / 2 / 32768)
    assert mixed.seconds == 0.1 and mixed.channels == 2


def test_a_flood_is_refused_by_the_rate_limit_before_it_is_decoded() -> None:
    audio, sink = raw(transcripts=2, options=RateLimitOptions(max_rate=1.0, burst_seconds=1.0))
    audio.receive(stereo_frames(8000), 0.0)  # the whole burst
    with pytest.raises(RateLimited):
        audio.receive(stereo_frames(800), 0.0)
    assert len(sink.received) == 1 and audio.seconds == 1.0  # the refused frame reached no one


def test_half_a_frame_cut_by_a_drop_or_the_end_is_not_audio() -> None:
    audio, sink = raw(transcripts=2)
    audio.receive(stereo_frames(10)[:-2], 0.0)  # the last frame lacks its right sample
    audio.restart(1.0)
    audio.receive(stereo_frames(10), 1.0)
    assert [s.audio.shape[1] for s in sink.received] == [9, 10]
    assert audio.end(2.0) is None


def test_a_stream_taken_over_counts_on_from_where_its_client_resends() -> None:
    audio, _ = raw(transcripts=2)
    audio.start_at(12.5)
    assert audio.frames == 100_000 and audio.seconds == 12.5
    audio.receive(stereo_frames(800), 0.0)
    assert audio.seconds == 12.6


def test_a_container_gets_the_container_input_and_raw_audio_needs_its_format() -> None:
    sink = Sink()
    options = RateLimitOptions()
    limiter = AudioRateLimiter(options, 0.0)
    container = open_audio_input(None, ContainerEncoding.CONTAINER, 1, options, limiter, sink)
    assert isinstance(container, ContainerInput) and container.channels is None  # no header yet
    container.start_at(3.0)
    assert container.seconds == 3.0
    with pytest.raises(InvalidState):
        open_audio_input(None, None, 1, options, limiter, sink)
