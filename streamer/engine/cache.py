"""An in-memory LRU cache of decode results, as an :class:`~streamer.engine.types.Engine` wrapper.

Identical audio (the same sample bytes) decoded with the same options and the same prompt gives the same result, so
it is answered from memory without touching the model: re-transcribing a file, re-running an evaluation, or clients
replaying the same clip. Wrap any engine::

    engine = CachingEngine(load_engine("tiny.en"), max_entries=256)

The key is the sha256 of the audio bytes (with dtype and shape), the ``repr`` of the options and the prompt; the
stream id, stream offset and request id are not part of it (results are window-relative). A hit comes back with the
caller's ``request_id``, zero timings and zero decoder passes, since no work was done for it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from streamer.engine.types import DecodeRequest, DecodeResult, Engine, EngineInfo, StageTimings, StreamId

__all__ = ["CacheStats", "CachingEngine", "cache_key"]


@dataclass(frozen=True)
class CacheStats:
    hits: int  # requests answered from the cache
    misses: int  # requests passed to the inner engine
    size: int  # entries held now


def cache_key(request: DecodeRequest) -> str:
    """The cache key of ``request``: what makes two requests give the same result."""
    audio = np.ascontiguousarray(request.audio)
    digest = hashlib.sha256()
    digest.update(f"{audio.dtype.str}{audio.shape}".encode())
    digest.update(audio.data.cast("B") if audio.size else b"")  # the bytes in place: no copy of the window
    digest.update(repr(request.options).encode())
    digest.update(b"\0")
    digest.update(request.prompt.encode())
    return digest.hexdigest()


class CachingEngine:
    """Answers repeated requests from an LRU cache of at most ``max_entries`` results; delegates the rest.

    Thread-safe: the cache is guarded by a lock that is never held while the inner engine decodes, so two threads
    asking for the same new audio at once may both decode it (the second result simply replaces the first).
    """

    def __init__(self, inner: Engine, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.inner: Engine = inner
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, DecodeResult] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def info(self) -> EngineInfo:
        return self.inner.info

    @property
    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(hits=self.hits, misses=self.misses, size=len(self._entries))

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        """Decode a batch, passing only the requests not in the cache to the inner engine (in one batch)."""
        keys = [cache_key(request) for request in requests]
        results: list[DecodeResult | None] = []
        # 1. Answer what the cache holds, refreshing each hit's place in the LRU order.
        with self._lock:
            for key, request in zip(keys, requests, strict=True):
                cached = self._entries.get(key)
                if cached is None:
                    results.append(None)
                    continue
                self._entries.move_to_end(key)
                self.hits += 1
                results.append(replace(cached, request_id=request.request_id, timings=StageTimings(), decoder_passes=0))
        # 2. Decode each distinct missing key once; a batch may hold the same window twice.
        first_index: dict[str, int] = {}
        for index, (key, result) in enumerate(zip(keys, results, strict=True)):
            if result is None and key not in first_index:
                first_index[key] = index
        if not first_index:
            return [result for result in results if result is not None]
        decoded = self.inner.decode([requests[index] for index in first_index.values()])
        by_key = dict(zip(first_index, decoded, strict=True))
        # 3. Store the new results, evicting the least recently used beyond max_entries.
        with self._lock:
            for key, result in by_key.items():
                self._entries[key] = result
                self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            self.misses += len(first_index)
            duplicates = sum(1 for r in results if r is None) - len(first_index)
            self.hits += duplicates
        # 4. Fill in the misses, each with its own request id.
        answered: list[DecodeResult] = []
        for index, (key, result) in enumerate(zip(keys, results, strict=True)):
            if result is not None:
                answered.append(result)
            elif first_index[key] == index:
                answered.append(by_key[key])
            else:
                fresh = by_key[key]
                answered.append(
                    replace(fresh, request_id=requests[index].request_id, timings=StageTimings(), decoder_passes=0)
                )
        return answered

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        with self._lock:
            self._entries.clear()

    def forget_stream(self, stream_id: StreamId) -> None:
        self.inner.forget_stream(stream_id)

    def close(self) -> None:
        self.clear()
        self.inner.close()
