from __future__ import annotations

from dataclasses import replace

import pytest

from streamer.app import App
from streamer.core.errors import ConfigError, RateLimited
from streamer.engine.fake import ScriptedEngine
from streamer.server.ratelimit import AudioRateLimiter, RateLimitOptions
from streamer.server.serve import Server, ServerConfig
from streamer.server.session_options import SessionOptions
from tests.helpers import WORDS, chunks, exchange, pcm16, speech


def test_a_burst_goes_through_at_once_then_the_rate_holds() -> None:
    limiter = AudioRateLimiter(RateLimitOptions(max_rate=2.0, burst_seconds=10.0), now=0.0)
    limiter.receive(16000 * 10, 16000, now=0.0)  # the whole burst in one go
    with pytest.raises(RateLimited) as info:
        limiter.receive(1600, 16000, now=0.0)  # 0.1 s more, with no time passed
    assert (info.value.code, info.value.close_code) == ("rate_limited", 4429)
    # one wall-clock second refills two seconds of audio at max_rate=2
    limiter.receive(32000, 16000, now=1.0)
    with pytest.raises(RateLimited):
        limiter.receive(1, 16000, now=1.0)


def test_real_time_never_runs_out() -> None:
    limiter = AudioRateLimiter(RateLimitOptions(max_rate=1.0, burst_seconds=0.5), now=0.0)
    for step in range(1, 3000):  # 100 ms frames, each on time, for five minutes
        limiter.receive(1600, 16000, now=step * 0.1)


def test_cost_is_stream_time_whatever_the_client_rate() -> None:
    limiter = AudioRateLimiter(RateLimitOptions(max_rate=1.0, burst_seconds=1.0), now=0.0)
    limiter.receive(8000, 8000, now=0.0)  # one second at 8 kHz empties a one-second bucket
    with pytest.raises(RateLimited):
        limiter.receive(8, 8000, now=0.0)


def test_a_refused_frame_takes_nothing() -> None:
    limiter = AudioRateLimiter(RateLimitOptions(max_rate=1.0, burst_seconds=1.0), now=0.0)
    with pytest.raises(RateLimited):
        limiter.receive(32000, 16000, now=0.0)
    limiter.receive(16000, 16000, now=0.0)


def test_the_bucket_never_holds_more_than_the_burst() -> None:
    limiter = AudioRateLimiter(RateLimitOptions(max_rate=2.0, burst_seconds=1.0), now=0.0)
    limiter.receive(16000, 16000, now=1000.0)  # a long pause refills the burst, no more
    with pytest.raises(RateLimited):
        limiter.receive(1, 16000, now=1000.0)


def test_rate_zero_turns_the_limit_off() -> None:
    limiter = AudioRateLimiter(RateLimitOptions(max_rate=0.0, burst_seconds=1.0), now=0.0)
    limiter.receive(16000 * 3600, 16000, now=0.0)


@pytest.mark.parametrize(("rate", "burst"), [(-1.0, 1.0), (0.5, 1.0), (2.0, 0.0)])
def test_options_are_validated(rate: float, burst: float) -> None:
    with pytest.raises(ConfigError):
        RateLimitOptions(max_rate=rate, burst_seconds=burst).validate()


async def test_a_client_far_ahead_of_real_time_gets_rate_limited_then_4429() -> None:
    limit = RateLimitOptions(max_rate=1.0, burst_seconds=2.0)
    config = ServerConfig(port=0, session=replace(SessionOptions(), rate_limit=limit))
    async with App(config, ScriptedEngine(WORDS)) as srv:
        messages, code = await exchange(srv, chunks(pcm16(speech())))  # ~14 s of audio at once
    assert code == 4429
    error = messages[-1]
    assert error["type"] == "error" and error["code"] == "rate_limited"
    # the audio accepted before the limit is accounted for: finals, not silence
    assert sum(m["end"] - m["start"] for m in messages if m["type"] == "final") > 1.0


async def test_the_default_limit_lets_a_short_clip_through_at_once(server: Server) -> None:
    messages, code = await exchange(server, [*chunks(pcm16(speech())), '{"type":"end"}'])
    assert code == 1000 and messages[-1]["type"] == "done"
