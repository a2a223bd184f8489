from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from streamer.engine.cache import CacheStats, CachingEngine
from streamer.engine.types import (
    DecodeOptions,
    DecodeRequest,
    DecodeResult,
    Engine,
    EngineInfo,
    SegmentResult,
    StageTimings,
    StreamId,
)


class CountingEngine:
    """Answers each request with its audio's sum as text; counts what reaches it."""

    def __init__(self) -> None:
        self.decoded: list[DecodeRequest] = []
        self.forgotten: list[StreamId] = []
        self.closed = False

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(model="counting", multilingual=False, encoder="fp32/cpu", decoder="fp32/cpu")

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        self.decoded.extend(requests)
        return [
            DecodeResult(
                request_id=r.request_id,
                text=f"{float(r.audio.sum()):.1f} {r.prompt}",
                language="en",
                segments=(SegmentResult(0, len(r.audio), "x", (1,), ()),),
                avg_logprob=-0.1,
                no_speech_prob=0.0,
                compression_ratio=1.0,
                temperature=0.0,
                decoder_passes=3,
                timings=StageTimings(encoder=0.5),
            )
            for r in requests
        ]

    def forget_stream(self, stream_id: StreamId) -> None:
        self.forgotten.append(stream_id)

    def close(self) -> None:
        self.closed = True


def request(value: float, request_id: int = 0, **kwargs: object) -> DecodeRequest:
    return DecodeRequest(audio=np.full(1600, value, dtype=np.float32), request_id=request_id, **kwargs)  # type: ignore[arg-type]


def test_is_an_engine() -> None:
    assert isinstance(CachingEngine(CountingEngine()), Engine)


def test_second_identical_request_does_not_touch_the_inner_engine() -> None:
    inner = CountingEngine()
    engine = CachingEngine(inner)
    first = engine.decode([request(1.0, request_id=1)])
    second = engine.decode([request(1.0, request_id=2)])
    assert len(inner.decoded) == 1
    assert second[0].text == first[0].text
    assert second[0].request_id == 2
    # no work was done for a hit
    assert second[0].timings == StageTimings() and second[0].decoder_passes == 0
    assert engine.stats == CacheStats(hits=1, misses=1, size=1)


def test_different_options_prompt_or_audio_miss() -> None:
    inner = CountingEngine()
    engine = CachingEngine(inner)
    engine.decode([request(1.0)])
    engine.decode([request(1.0, options=DecodeOptions(beam_size=5))])
    engine.decode([request(1.0, prompt="hello")])
    engine.decode([request(2.0)])
    assert len(inner.decoded) == 4
    assert engine.stats == CacheStats(hits=0, misses=4, size=4)


def test_a_session_prompt_keywords_or_bonus_of_their_own_miss() -> None:
    """A window decoded with other keywords decodes differently: they are part of the key (in the options)."""
    inner = CountingEngine()
    engine = CachingEngine(inner)
    for options in (
        DecodeOptions(),
        DecodeOptions(keywords=("Zoë",)),
        DecodeOptions(keywords=("Zoe",)),
        DecodeOptions(keywords=("Zoë", "Ada")),
        DecodeOptions(keywords=("Zoë",), keyword_bonus=4.0),
        DecodeOptions(initial_prompt="A cooking show."),
    ):
        engine.decode([request(1.0, options=options)])
    engine.decode([request(1.0, options=DecodeOptions(keywords=("Zoë", "Ada")))])
    assert engine.stats == CacheStats(hits=1, misses=6, size=6)


def test_stream_id_and_offset_are_not_part_of_the_key() -> None:
    inner = CountingEngine()
    engine = CachingEngine(inner)
    engine.decode([request(1.0, stream_id=StreamId("a"), stream_offset=0)])
    engine.decode([request(1.0, stream_id=StreamId("b"), stream_offset=16000)])
    assert len(inner.decoded) == 1


def test_mixed_batch_keeps_order_and_sends_only_misses_once() -> None:
    inner = CountingEngine()
    engine = CachingEngine(inner)
    engine.decode([request(1.0)])
    results = engine.decode([request(2.0, 10), request(1.0, 11), request(2.0, 12), request(3.0, 13)])
    assert [r.request_id for r in results] == [10, 11, 12, 13]
    assert [r.text.strip() for r in results] == ["3200.0", "1600.0", "3200.0", "4800.0"]
    # 1.0 was cached; 2.0 appears twice in the batch but is decoded once
    assert [float(r.audio[0]) for r in inner.decoded] == [1.0, 2.0, 3.0]
    assert engine.stats == CacheStats(hits=2, misses=3, size=3)


def test_least_recently_used_entry_is_evicted() -> None:
    inner = CountingEngine()
    engine = CachingEngine(inner, max_entries=2)
    engine.decode([request(1.0)])
    engine.decode([request(2.0)])
    engine.decode([request(1.0)])  # refreshes 1.0
    engine.decode([request(3.0)])  # evicts 2.0
    assert engine.stats.size == 2
    engine.decode([request(1.0)])
    assert len(inner.decoded) == 3
    engine.decode([request(2.0)])
    assert len(inner.decoded) == 4


def test_delegates_info_forget_stream_and_close() -> None:
    inner = CountingEngine()
    engine = CachingEngine(inner)
    engine.decode([request(1.0)])
    assert engine.info.model == "counting"
    engine.forget_stream(StreamId("s"))
    assert inner.forgotten == ["s"]
    engine.close()
    assert inner.closed and engine.stats.size == 0


def test_rejects_an_empty_cache() -> None:
    with pytest.raises(ValueError):
        CachingEngine(CountingEngine(), max_entries=0)


def test_concurrent_use_keeps_counters_consistent() -> None:
    engine = CachingEngine(CountingEngine(), max_entries=8)

    def work(offset: int) -> None:
        for i in range(50):
            engine.decode([request(float((i + offset) % 12))])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = engine.stats
    assert stats.hits + stats.misses == 200
    assert stats.size <= 8
