from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt
import pytest

from streamer.core.errors import AtCapacity, ConfigError, InvalidState
from streamer.core.events import Event, Final, Lost, NonSpeech, Word
from streamer.core.options import CoreOptions
from streamer.core.stream import StreamCore
from streamer.engine.fake import ScriptedEngine, synthetic_silence, synthetic_voice, words_from_text
from streamer.engine.types import DecodeRequest, DecodeResult, EngineInfo, StreamId
from streamer.server.scheduler import CoreClient, Scheduler, SchedulerOptions


class RecordingEngine:
    """Answers every window with its stream id; can fail chosen batches, or every batch holding a window of chosen
    streams; records batches and threads."""

    def __init__(self, fail_batches: Sequence[int] = (), fail_streams: Sequence[str] = ()) -> None:
        self.batches: list[list[StreamId | None]] = []
        self.threads: set[int] = set()
        self.forgotten: list[StreamId] = []
        self.fail_batches = set(fail_batches)
        self.fail_streams = set(fail_streams)

    @property
    def info(self) -> EngineInfo:
        return EngineInfo(model="recording", multilingual=False, encoder="none", decoder="none")

    def decode(self, requests: Sequence[DecodeRequest]) -> list[DecodeResult]:
        self.threads.add(threading.get_ident())
        self.batches.append([r.stream_id for r in requests])
        if len(self.batches) - 1 in self.fail_batches or self.fail_streams & {r.stream_id for r in requests}:
            raise RuntimeError("CUDA out of memory (secret internals)")
        return [DecodeResult(r.request_id, str(r.stream_id), "en", (), 0.0, 0.0, 1.0, 0.0) for r in requests]

    def forget_stream(self, stream_id: StreamId) -> None:
        self.forgotten.append(stream_id)

    def close(self) -> None:
        pass


@dataclass
class Stream:
    """A DecodeClient that offers ``windows`` windows one at a time, like a core with one outstanding."""

    name: str
    windows: int
    outstanding: bool = False
    next_id: int = 0
    closing: set[int] = field(default_factory=set)  # the windows (1-based, in offer order) that close an utterance
    opening: set[int] = field(default_factory=set)  # ... that open an utterance's text
    results: list[str] = field(default_factory=list)
    failures: list[tuple[int, str]] = field(default_factory=list)

    @property
    def stream_id(self) -> StreamId:
        return StreamId(self.name)

    def has_work(self) -> bool:
        return not self.outstanding and self.windows > 0

    def final_due(self) -> bool:
        return self.has_work() and self.next_id + 1 in self.closing

    def opening_due(self) -> bool:
        return self.has_work() and self.next_id + 1 in self.opening

    def windows_to_decode(self) -> list[DecodeRequest]:
        if not self.has_work():
            return []
        self.outstanding = True
        self.windows -= 1
        self.next_id += 1
        audio = np.zeros(1600, dtype=np.float32)
        return [DecodeRequest(audio=audio, stream_id=self.stream_id, request_id=self.next_id)]

    def receive_decode_result(self, result: DecodeResult) -> None:
        self.outstanding = False
        self.results.append(result.text)

    def receive_decode_failure(self, request_id: int, reason: str) -> None:
        self.outstanding = False
        self.failures.append((request_id, reason))


def make(engine: RecordingEngine, batch: int = 8, sessions: int = 16, finals_alone: bool = True) -> Scheduler:
    return Scheduler(engine, SchedulerOptions(max_batch_size=batch, max_sessions=sessions, finals_alone=finals_alone))


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="max_batch_size"):
        make(RecordingEngine(), batch=0)
    with pytest.raises(ConfigError, match="max_sessions"):
        make(RecordingEngine(), sessions=0)
    with pytest.raises(ConfigError, match="opening_batch_size"):
        Scheduler(RecordingEngine(), SchedulerOptions(opening_batch_size=0))


def test_admission_control_refuses_past_max_sessions() -> None:
    scheduler = make(RecordingEngine(), sessions=2)
    scheduler.admit("a")
    scheduler.admit("b")
    with pytest.raises(AtCapacity) as info:
        scheduler.admit("c")
    assert info.value.close_code == 1013
    assert scheduler.metrics.admission_rejections.value == 1
    scheduler.release("a")
    scheduler.admit("c")
    assert scheduler.active_sessions == 2


def test_batches_take_at_most_one_window_per_stream_and_respect_max_batch_size() -> None:
    scheduler = make(RecordingEngine(), batch=2)
    streams = [Stream(name, windows=3) for name in "abc"]
    for s in streams:
        scheduler.register(s)
    first = scheduler.next_batch()
    assert first is not None
    assert [r.stream_id for r in first.requests] == ["a", "b"]
    # c was not asked yet, so it is the one stream waiting
    assert scheduler.queue_depth() == 1


def test_round_robin_is_fair_across_streams() -> None:
    scheduler = make(RecordingEngine(), batch=2)
    streams = {name: Stream(name, windows=100) for name in "abcd"}
    for s in streams.values():
        scheduler.register(s)
    served: list[str] = []
    for _ in range(8):
        batch = scheduler.next_batch()
        assert batch is not None
        served += [str(r.stream_id) for r in batch.requests]
        scheduler.deliver(batch, [DecodeResult(r.request_id, "", "en", (), 0, 0, 1, 0) for r in batch.requests])
    # 16 windows over 4 streams: each got exactly 4, in strict rotation
    assert served == list("abcd" * 4)


def _serve(scheduler: Scheduler, batches: int) -> list[list[str]]:
    served = []
    for _ in range(batches):
        batch = scheduler.next_batch()
        assert batch is not None
        served.append([str(r.stream_id) for r in batch.requests])
        scheduler.deliver(batch, [DecodeResult(r.request_id, "", "en", (), 0, 0, 1, 0) for r in batch.requests])
    return served


@pytest.mark.parametrize(
    ("finals_alone", "expected"),
    [
        # the closing window is decoded alone: its final waits for no partial update
        (True, [["a", "b"], ["c", "d"], ["d"], ["a", "b"]]),
        # or with the next partial update in the rotation beside it
        (False, [["a", "b"], ["c", "d"], ["d", "a"], ["b", "c"]]),
    ],
)
def test_windows_that_close_an_utterance_go_first(finals_alone: bool, expected: list[list[str]]) -> None:
    scheduler = make(RecordingEngine(), batch=2, finals_alone=finals_alone)
    streams = {name: Stream(name, windows=100) for name in "abcd"}
    streams["d"].closing = {2}  # d's second window is its utterance's last
    for s in streams.values():
        scheduler.register(s)
    # d's first window waits its turn; its closing one (the next) jumps ahead of a, b and c in the rotation
    assert _serve(scheduler, 4) == expected


@pytest.mark.parametrize(
    ("openings_first", "expected"),
    [
        # e's opening window jumps the rotation, in a batch of at most 2 (beside the head of the rotation); the
        # batches after it are full again
        (True, [["a", "b", "c", "d"], ["e", "a"], ["b", "c", "d", "e"]]),
        # or it takes its turn in batches of 4
        (False, [["a", "b", "c", "d"], ["e", "a", "b", "c"], ["d", "e", "a", "b"]]),
    ],
)
def test_windows_that_open_an_utterances_text_go_next_in_a_short_batch(
    openings_first: bool, expected: list[list[str]]
) -> None:
    options = SchedulerOptions(max_batch_size=4, openings_first=openings_first, opening_batch_size=2)
    scheduler = Scheduler(RecordingEngine(), options)
    streams = {name: Stream(name, windows=100) for name in "abcde"}
    streams["e"].opening = {1}
    streams["e"].closing = {3}
    for s in streams.values():
        scheduler.register(s)
    streams["e"].outstanding = True  # e's first window comes due while the first batch is formed
    first = scheduler.next_batch()
    assert first is not None and [str(r.stream_id) for r in first.requests] == expected[0]
    streams["e"].outstanding = False
    scheduler.deliver(first, [DecodeResult(r.request_id, "", "en", (), 0, 0, 1, 0) for r in first.requests])
    assert _serve(scheduler, 2) == expected[1:]
    # a closing window still goes first, and alone
    assert _serve(scheduler, 1) == [["e"]]


def test_closing_windows_are_served_round_robin_and_partials_still_get_their_turn() -> None:
    scheduler = make(RecordingEngine(), batch=2)
    streams = {name: Stream(name, windows=100, closing=set(range(1, 101))) for name in "abc"}
    streams["d"] = Stream("d", windows=100)  # never closes an utterance
    for s in streams.values():
        scheduler.register(s)
    served = _serve(scheduler, 6)
    assert [w for b in served for w in b].count("d") == 0  # while closing windows wait, they take every slot
    assert served[:3] == [["a", "b"], ["c", "a"], ["b", "c"]]
    for s in "abc":
        streams[s].closing = set()
    assert "d" in _serve(scheduler, 2)[0]  # the first batch without a closing window serves d, first in the rotation


def test_a_stream_with_a_window_outstanding_is_not_asked_again() -> None:
    scheduler = make(RecordingEngine())
    stream = Stream("a", windows=5)
    scheduler.register(stream)
    assert scheduler.next_batch() is not None
    assert scheduler.next_batch() is None  # the first window is still outstanding


def test_register_twice_is_a_bug() -> None:
    scheduler = make(RecordingEngine())
    scheduler.register(Stream("a", 1))
    with pytest.raises(InvalidState):
        scheduler.register(Stream("a", 1))


async def wait_until(predicate: object, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.005)


async def test_run_decodes_on_one_worker_thread_and_delivers_results() -> None:
    engine = RecordingEngine()
    scheduler = make(engine, batch=4)
    streams = [Stream(name, windows=3) for name in "ab"]
    scheduler.start()
    try:
        for s in streams:
            scheduler.register(s)
        await wait_until(lambda: all(len(s.results) == 3 for s in streams))
    finally:
        await scheduler.stop()
    assert streams[0].results == ["a", "a", "a"]
    assert len(engine.threads) == 1
    assert threading.get_ident() not in engine.threads  # never on the event loop
    assert engine.batches[0] == ["a", "b"]  # batched together
    assert scheduler.metrics.windows.value == 6


async def test_each_call_takes_the_threads_asked_for_on_the_engine_thread_before_it_decodes() -> None:
    engine = RecordingEngine()
    asked = iter([2, None, 1])
    applied: list[tuple[int, int, int]] = []  # (threads, thread, batches decoded before)

    def set_threads(count: int) -> None:
        applied.append((count, threading.get_ident(), len(engine.batches)))

    options = SchedulerOptions(max_batch_size=1, max_sessions=4)
    scheduler = Scheduler(engine, options, threads=lambda: next(asked), set_threads=set_threads)
    stream = Stream("a", windows=3)
    scheduler.start()
    try:
        scheduler.register(stream)
        await wait_until(lambda: len(stream.results) == 3)
    finally:
        await scheduler.stop()
    # None leaves the threads as they were: nothing applied before the second call
    assert [(count, before) for count, _, before in applied] == [(2, 0), (1, 2)]
    assert {thread for _, thread, _ in applied} == engine.threads  # on the engine's own thread
    assert scheduler.metrics.registry.get_sample_value("streamer_engine_threads") == 1


async def test_a_window_that_fails_alone_is_lost_and_the_next_one_runs() -> None:
    engine = RecordingEngine(fail_batches=[0])
    scheduler = make(engine, batch=4)
    stream = Stream("a", windows=2)
    scheduler.start()
    try:
        scheduler.register(stream)
        await wait_until(lambda: stream.results)
    finally:
        await scheduler.stop()
    assert stream.failures == [(1, "the engine failed to decode this window")]  # no internals leak
    assert stream.results == ["a"]
    assert engine.batches == [["a"], ["a"]]  # a batch of one already ran alone: not tried again
    assert scheduler.metrics.batch_failures.value == 1 and scheduler.metrics.windows_retried.value == 0


async def test_a_batch_that_raises_is_decoded_again_window_by_window_and_loses_nothing() -> None:
    engine = RecordingEngine(fail_batches=[0])  # a failure of the batch, not of any window (memory, say)
    scheduler = make(engine, batch=4)
    streams = [Stream(name, windows=2) for name in "ab"]
    scheduler.start()
    try:
        for s in streams:
            scheduler.register(s)
        await wait_until(lambda: all(len(s.results) == 2 for s in streams))
    finally:
        await scheduler.stop()
    assert engine.batches == [["a", "b"], ["a"], ["b"], ["a", "b"]]  # in order, on the one worker thread
    assert len(engine.threads) == 1
    for s in streams:
        assert s.failures == [] and s.results == [s.name, s.name]
    assert scheduler.metrics.batch_failures.value == 1 and scheduler.metrics.windows_retried.value == 2
    assert scheduler.metrics.windows.value == 4
    assert scheduler.outcomes == 4  # each window's outcome once, the retried ones included


async def test_only_the_window_the_engine_cannot_decode_fails_the_others_of_its_batch_are_delivered() -> None:
    engine = RecordingEngine(fail_streams=["b"])  # b's windows make any batch holding them raise
    scheduler = make(engine, batch=3)
    streams = {name: Stream(name, windows=2) for name in "abc"}
    scheduler.start()
    try:
        for s in streams.values():
            scheduler.register(s)
        await wait_until(lambda: all(not s.has_work() and not s.outstanding for s in streams.values()))
    finally:
        await scheduler.stop()
    assert engine.batches[:4] == [["a", "b", "c"], ["a"], ["b"], ["c"]]
    for name in "ac":
        assert streams[name].results == [name, name] and streams[name].failures == []
    assert streams["b"].results == []
    lost = "the engine failed to decode this window"
    assert streams["b"].failures == [(1, lost), (2, lost)]
    # two batches raised, then b's window alone each time
    assert scheduler.metrics.batch_failures.value == 4 and scheduler.metrics.windows_retried.value == 6


async def test_unregister_drops_results_and_forgets_the_stream() -> None:
    engine = RecordingEngine()
    scheduler = make(engine)
    stream = Stream("a", windows=1)
    scheduler.start()
    try:
        scheduler.register(stream)
        batch = scheduler.next_batch()
        assert batch is not None
        scheduler.unregister(stream)
        scheduler.deliver(batch, [DecodeResult(1, "late", "en", (), 0, 0, 1, 0)])
    finally:
        await scheduler.stop()
    assert stream.results == []
    assert engine.forgotten == ["a"]


def test_every_window_outcome_is_counted_whatever_its_stream_became() -> None:
    # what an ended stream waiting for its last windows reads as the engine being alive (FlushBound)
    scheduler = make(RecordingEngine(), batch=2)
    streams = [Stream(name, windows=2) for name in "ab"]
    for stream in streams:
        scheduler.register(stream)
    assert scheduler.outcomes == 0
    first = scheduler.next_batch()
    assert first is not None
    scheduler.fail(first, "the engine failed to decode this window")
    assert scheduler.outcomes == 2
    second = scheduler.next_batch()
    assert second is not None
    scheduler.unregister(streams[1])  # its result is dropped, but the engine did hand it back
    scheduler.deliver(second, [DecodeResult(r.request_id, "x", "en", (), 0, 0, 1, 0) for r in second.requests])
    assert scheduler.outcomes == 4 and streams[0].results == ["x"] and streams[1].results == []


async def test_start_twice_is_a_bug() -> None:
    scheduler = make(RecordingEngine())
    scheduler.start()
    try:
        with pytest.raises(InvalidState):
            scheduler.start()
    finally:
        await scheduler.stop()


SR = 16000
SEEDS = {"a": 0, "bad": 2, "c": 4}  # each stream's own audio and words, whoever it runs with


def two_utterances(seed: int) -> tuple[npt.NDArray[np.float32], list[Word]]:
    """0.5 s of silence, 3 s of speech, 1 s of silence, 2 s of speech, 1 s of silence; and the words said."""
    parts = [synthetic_silence(SR // 2, seed), synthetic_voice(3 * SR, seed), synthetic_silence(SR, seed)]
    parts += [synthetic_voice(2 * SR, seed + 1), synthetic_silence(SR, seed + 1)]
    words = words_from_text(f"s{seed}a one two three four five", SR // 2 + 800, 6000, 1600)
    words += words_from_text(f"s{seed}b six seven eight", 9 * SR // 2 + 800, 6000, 1600)
    return np.concatenate(parts), words


async def transcribe_together(streams: dict[str, CoreOptions]) -> tuple[dict[str, list[Event]], Scheduler]:
    """Every stream's whole audio and its end go in first, so its windows do not depend on timing; then one
    scheduler over one English-only scripted engine decodes them all, batched; return each stream's events."""
    audio = {name: two_utterances(SEEDS[name]) for name in streams}
    engine = ScriptedEngine({StreamId(name): words for name, (_, words) in audio.items()})
    scheduler = Scheduler(engine, SchedulerOptions(max_batch_size=3))
    events: dict[str, list[Event]] = {name: [] for name in streams}
    clients = []
    for name, options in streams.items():
        core = StreamCore(options, StreamId(name))
        core.receive_audio(audio[name][0])
        core.receive_end_of_stream()
        events[name] += core.events_received()
        clients.append(CoreClient(core, SR, lambda core=core, name=name: events[name].extend(core.events_received())))
    for client in clients:
        scheduler.register(client)
    scheduler.start()
    try:
        await wait_until(lambda: all(client.core.done for client in clients))
    finally:
        await scheduler.stop()
    for name, (samples, _) in audio.items():
        assert_accounted(events[name], len(samples))
    return events, scheduler


def assert_accounted(events: list[Event], samples: int) -> None:
    """The conservation rule: Final, NonSpeech and Lost spans tile [0, samples) in stream order."""
    spans = [(e.start, e.end) for e in events if isinstance(e, Final | NonSpeech | Lost)]
    assert spans and spans[0][0] == 0 and spans[-1][1] == samples
    assert all(end == start for (_, end), (start, _) in itertools.pairwise(spans))


async def test_a_stream_the_engine_cannot_decode_costs_the_streams_batched_with_it_nothing() -> None:
    english = CoreOptions()
    german = replace(english, decode=replace(english.decode, language="de"))  # what tiny.en raises on
    alone = {name: (await transcribe_together({name: english}))[0][name] for name in ("a", "c")}
    together, scheduler = await transcribe_together({"a": english, "bad": german, "c": english})
    assert scheduler.metrics.windows_retried.value >= 3  # the bad window did go into a batch with the others
    # the others: the same events, to the word and the sample, as when each ran alone
    for name in ("a", "c"):
        assert together[name] == alone[name]
        assert not [e for e in together[name] if isinstance(e, Lost)]
        said = f"s{SEEDS[name]}a one two three four five s{SEEDS[name]}b six seven eight"
        assert " ".join(e.text for e in together[name] if isinstance(e, Final) and e.text) == said
    # the bad one: each of its utterances is lost, by range, and nothing else
    lost = [e for e in together["bad"] if isinstance(e, Lost)]
    assert len(lost) == 2 and all(e.reason == "the engine failed to decode this window" for e in lost)
    assert not [e for e in together["bad"] if isinstance(e, Final) and e.text]
    # its speech is 0.5-3.5 s and 4.5-6.5 s; the VAD's padding around it goes with it
    assert lost[0].start < SR // 2 and lost[0].end > 7 * SR // 2
    assert lost[0].end < lost[1].start < 9 * SR // 2 and lost[1].end > 13 * SR // 2
