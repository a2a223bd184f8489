"""The scheduler decides which windows of which streams the one shared engine decodes together.

Like vLLM's ``schedule()`` / ``update_from_output()``: :meth:`Scheduler.next_batch` picks up to
``max_batch_size`` windows, round-robin over the registered streams and at most one per stream, and
:meth:`Scheduler.deliver` / :meth:`Scheduler.fail` hand the outcome back to each stream. Both are plain methods,
testable without an event loop. :meth:`Scheduler.run` is the only I/O: it calls ``engine.decode`` on a single
worker thread (``run_in_executor``), never on the event loop, and never runs the model any other way.

A window the engine cannot decode costs only itself: when a batch raises, each of its windows is decoded again
alone, in order, on the same worker thread, and only those that fail alone are reported lost
(:meth:`Scheduler.deliver_retried`). Before this one stream's bad window (a language the model lacks) cost every
stream batched with it its audio (issue 14, finding 2).

Coalescing is inherent: a stream is asked for work only when a batch is being formed, and a
:class:`~streamer.core.stream.StreamCore` keeps at most one window outstanding, so a stream that falls behind offers its
newest window instead of queueing stale ones.

Admission control bounds the work: :meth:`Scheduler.admit` refuses a session past ``max_sessions`` with
:class:`~streamer.core.errors.AtCapacity` (close 1013).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from streamer.core.audio import Resampler
from streamer.core.errors import AtCapacity, ConfigError, InvalidState
from streamer.core.stream import StreamCore
from streamer.core.units import SAMPLE_RATE, samples_to_seconds
from streamer.engine.kernels import use_threads
from streamer.engine.types import DecodeRequest, DecodeResult, Engine, StreamId
from streamer.server.metrics import OTHER_ROUTE, ServerMetrics
from streamer.server.tracing import NO_TRACING, AttributeValue, Tracer

__all__ = ["Batch", "DecodeClient", "Decoded", "Scheduler", "SchedulerOptions"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerOptions:
    """How much work the shared engine takes on. Validated in :meth:`validate`."""

    # at most this many windows (each from a different stream) go into one engine.decode call. On a saturated CPU a
    # window's latency is the batch running when it comes plus its own; a batch shares its decoder passes (a pass
    # over four rows costs little more than over one), while each window's encoder and its ~20 MB of cross-attention
    # state are its own. `streamer bench accuracy --mode realtime --streams 8 --max-batch-size N [--openings-first]`
    # (clients in a process of their own), Zen 4 EPYC, final delay p50 / p95 and first partial p50. 2026-12-06,
    # without openings_first: tuning half 1.61 / 7.07 / 0.55 s at 2, 1.91 / 4.37 / 0.63 s at 4, 3.03 / 5.34 / 0.70 s
    # at 8; report half 1.54 / 5.65 / 0.57 s at 2, 2.09 / 4.84 / 0.82 s at 4: larger batches shorten a saturated
    # engine's tail and lengthen the first partial (every window waits for its whole batch). 2026-12-06 later, the
    # same hour each: tuning half 1.43 / 5.13 / 0.47 s at 2, 1.65 / 3.75 / 0.45 s at 4 with openings_first (streamed
    # WER 9.21 against 8.86 %, offline 8.80); report half 1.50 / 5.22 / 0.61 s against 1.72 / 4.31 / 0.60 s (WER 8.29
    # against 7.97 %, offline 8.41). So 4, with openings_first: the tail of batches of 4 and the first partial of
    # batches of 2. On an AMX Xeon, 3 against 2 (before openings_first) made no difference (2.07 against 2.05 s). A GPU
    # wants more (bench/gpu.sh sweeps it).
    max_batch_size: int = 4
    # sessions beyond this are refused with at_capacity (close 1013); a two-channel session counts once
    max_sessions: int = 16
    # windows that close an utterance go into the next batch ahead of partial updates (False: strict rotation);
    # streamer bench scheduling measures both side by side
    finals_first: bool = True
    # with finals_first: a batch that takes a closing window takes no partial updates beside it, so that the final
    # waits for its own window's decode alone (False: the rest of the batch is filled with partial updates)
    finals_alone: bool = True
    # windows whose partial is the first text of an utterance (or of the speech after a commit) go into the next batch
    # after closing windows and ahead of other partial updates, and a batch that takes one takes at most
    # opening_batch_size windows: the first partial waits for a short batch, while the other windows go in batches
    # of max_batch_size (False: they take their turn in the rotation). Measured with max_batch_size above
    openings_first: bool = True
    opening_batch_size: int = 2

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.max_batch_size < 1:
            raise ConfigError("max_batch_size must be >= 1")
        if self.opening_batch_size < 1:
            raise ConfigError("opening_batch_size must be >= 1")
        if self.max_sessions < 1:
            raise ConfigError("max_sessions must be >= 1")


class DecodeClient(Protocol):
    """One stream as the scheduler sees it (the session wraps each StreamCore in one).

    All methods are called on the event loop thread.
    """

    @property
    def stream_id(self) -> StreamId: ...

    def has_work(self) -> bool:
        """Whether :meth:`windows_to_decode` would offer a window now (for the queue depth gauge)."""
        ...

    def final_due(self) -> bool:
        """Whether the window :meth:`windows_to_decode` would offer now closes an utterance (its final is waiting
        on it): such windows go first."""
        ...

    def opening_due(self) -> bool:
        """Whether the window :meth:`windows_to_decode` would offer now opens an utterance's text (its partial is the
        first the speaker sees of it): with ``openings_first``, such windows go right after closing ones."""
        ...

    def windows_to_decode(self) -> list[DecodeRequest]:
        """The windows ready to decode; each returned one is outstanding until its result or failure arrives."""
        ...

    def receive_decode_result(self, result: DecodeResult) -> None: ...

    def receive_decode_failure(self, request_id: int, reason: str) -> None: ...


class CoreClient:
    """A :class:`DecodeClient` over one :class:`~streamer.core.stream.StreamCore`: the session's channel or the call
    pipeline's track. It feeds the core its results with the clock (the one place that reads it for the core) and
    calls ``on_update`` after each, so the owner can drain the core's events."""

    def __init__(self, core: StreamCore, sample_rate: int, on_update: Callable[[], None]) -> None:
        if core.stream_id is None:
            raise InvalidState("a scheduled core needs a stream id")
        self.core = core
        self._stream_id = core.stream_id
        self.resampler = Resampler(sample_rate, SAMPLE_RATE)  # the client's audio, at the model's rate
        self._on_update = on_update
        self.offered = False  # whether the core may have a window ready that the scheduler has not taken

    @property
    def stream_id(self) -> StreamId:
        return self._stream_id

    def has_work(self) -> bool:
        return self.offered

    def final_due(self) -> bool:
        return self.core.final_due

    def opening_due(self) -> bool:
        return self.core.opening_due

    def windows_to_decode(self) -> list[DecodeRequest]:
        self.offered = False
        return self.core.windows_to_decode()

    def receive_decode_result(self, result: DecodeResult) -> None:
        self.core.receive_decode_result(result)
        self.offered = True  # the core may have held the next window back until this result
        self._on_update()

    def receive_decode_failure(self, request_id: int, reason: str) -> None:
        self.core.receive_decode_failure(request_id, reason)
        self.offered = True
        self._on_update()


@dataclass(frozen=True)
class Batch:
    """Windows to decode together, each with the stream it came from (requests in engine order)."""

    clients: tuple[DecodeClient, ...]
    requests: tuple[DecodeRequest, ...]
    audio_samples: int = field(default=0)


# what a stream hears when its window is lost to the engine; the engine's own error stays in the log
_ENGINE_FAILED = "the engine failed to decode this window"


@dataclass(frozen=True)
class Decoded:
    """What the worker thread made of one batch (:meth:`Scheduler.decode_isolating`)."""

    # per window in batch order: its result, or None when it failed (alone)
    results: tuple[DecodeResult | None, ...]
    # whether the batch as a whole raised, so that ``results`` come from windows decoded alone
    retried: bool = False
    # engine calls that raised: the batch, then each window that failed alone
    failed_calls: int = 0


class Scheduler:
    """Shares one engine between every stream; see the module docstring.

    Use: :meth:`admit` a session (and :meth:`release` it when it ends), :meth:`register` each of its streams
    (and :meth:`unregister` them), call :meth:`notify` whenever a stream may have new work, and keep
    :meth:`run` going as a task for the life of the server (:meth:`start` / :meth:`stop` do that).
    """

    def __init__(
        self,
        engine: Engine,
        options: SchedulerOptions,
        metrics: ServerMetrics | None = None,
        tracer: Tracer = NO_TRACING,
        threads: Callable[[], int | None] | None = None,
        set_threads: Callable[[int], object] = use_threads,
    ) -> None:
        """``threads``, asked on the event loop before each engine call: the threads that call runs on (None: as the
        last), which ``set_threads`` applies on the engine's thread (a worker's share of the cores:
        :func:`streamer.server.balance.engine_threads`); None: the engine's threads never change."""
        options.validate()
        self.engine = engine
        self.threads = threads
        self._set_threads = set_threads
        self.options = options
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self.tracer = tracer
        self._sessions: set[str] = set()
        # streams in round-robin order: the head is asked first; a stream that was served goes to the back
        self._rotation: deque[DecodeClient] = deque()
        # windows a stream offered beyond the one that went into a batch (a core keeps one outstanding, so rare)
        self._held: dict[StreamId, deque[DecodeRequest]] = {}
        self._wakeup = asyncio.Event()
        # windows whose outcome (a result or a failure) the engine has handed back, whatever their stream: a stream
        # waiting for its last windows reads it as the engine being alive (streamer.server.adapter.FlushBound)
        self.outcomes = 0
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None

    # -- admission --------------------------------------------------------------------------------------------------

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    def admit(self, session_id: str, route: str = OTHER_ROUTE) -> None:
        """Count a new session of ``route`` in, or raise :class:`~streamer.core.errors.AtCapacity` when
        ``max_sessions`` are open. ``route`` labels the session counters (a stream route's name, else ``other``)."""
        route = self.metrics.route_label(route)
        if len(self._sessions) >= self.options.max_sessions:
            self.metrics.admission_rejections.labels(route=route).inc()
            raise AtCapacity(f"the server is at capacity ({self.options.max_sessions} sessions); retry later")
        self._sessions.add(session_id)
        self.metrics.active_sessions.set(len(self._sessions))
        self.metrics.sessions_total.labels(route=route).inc()

    def release(self, session_id: str) -> None:
        """Count a session out (idempotent)."""
        self._sessions.discard(session_id)
        self.metrics.active_sessions.set(len(self._sessions))

    # -- streams ----------------------------------------------------------------------------------------------------

    def register(self, client: DecodeClient) -> None:
        """Start asking ``client`` for windows."""
        if any(c.stream_id == client.stream_id for c in self._rotation):
            raise InvalidState(f"stream {client.stream_id} is already registered")
        self._rotation.append(client)
        self._held[client.stream_id] = deque()
        self.notify()

    def unregister(self, client: DecodeClient) -> None:
        """Stop serving ``client``: results of its in-flight window are dropped, and the engine forgets it."""
        if client in self._rotation:
            self._rotation.remove(client)
        self._held.pop(client.stream_id, None)
        if self._executor is not None:
            # on the worker thread, so it never races a decode of the same stream
            self._executor.submit(self.engine.forget_stream, client.stream_id)

    def notify(self) -> None:
        """A stream may have new work: wake the loop if it is idle. Cheap; call after every core update."""
        self._wakeup.set()

    # -- deciding ---------------------------------------------------------------------------------------------------

    def next_batch(self) -> Batch | None:
        """Pick the next batch: at most one window per stream, at most ``max_batch_size`` windows; windows that
        close an utterance first, then (with ``openings_first``) those that open one's text, then the others, each
        group round-robin from the head of the rotation (with ``finals_alone``, a batch that holds a closing window
        holds no other; a batch that holds an opening window holds at most ``opening_batch_size``). Served streams
        move to the back: a stream offers a closing window at most once per utterance, and opening ones only until its
        utterance shows words (usually once or twice) and for at most its first
        :data:`~streamer.core.stream.OPENING_LIMIT_MS` of speech decoded without words (babble the VAD let through
        keeps no priority), and a batch holding an opening window still takes other windows beside it up to
        ``opening_batch_size``, so partial updates keep their turn.

        Why finals first: once the engine is saturated a window waits for the batches ahead of it, and a final's
        latency is what a user waits on (a partial is a preview, superseded a second later). Measured with
        ``streamer bench capacity`` on 2 cores: see docs/benchmarks.md.

        Every window returned is outstanding: the caller must follow with :meth:`deliver` or :meth:`fail`.
        """
        clients: list[DecodeClient] = []
        requests: list[DecodeRequest] = []
        rotation = list(self._rotation)
        options = self.options
        closing = {
            c.stream_id for c in rotation if options.finals_first and not self._held[c.stream_id] and c.final_due()
        }
        opening = {
            c.stream_id
            for c in rotation
            if options.openings_first and c.stream_id not in closing and not self._held[c.stream_id] and c.opening_due()
        }
        limit = options.max_batch_size

        def rank(client: DecodeClient) -> int:
            return 0 if client.stream_id in closing else 1 if client.stream_id in opening else 2

        for client in sorted(rotation, key=rank):  # stable: rotation order kept within each group
            if len(requests) >= limit:
                break
            if (
                options.finals_alone
                and client.stream_id not in closing
                and any(c.stream_id in closing for c in clients)
            ):
                break
            held = self._held[client.stream_id]
            if not held:
                held.extend(client.windows_to_decode())
            if held:
                clients.append(client)
                requests.append(held.popleft())
                if client.stream_id in opening:
                    limit = min(limit, options.opening_batch_size)
        for client in clients:
            self._rotation.remove(client)
            self._rotation.append(client)
        self.metrics.queue_depth.set(self.queue_depth())
        if not requests:
            return None
        return Batch(tuple(clients), tuple(requests), sum(len(r.audio) for r in requests))

    def queue_depth(self) -> int:
        """Streams with a window waiting for the engine (outside any running batch)."""
        return sum(1 for c in self._rotation if self._held[c.stream_id] or c.has_work())

    def deliver(self, batch: Batch, results: Sequence[DecodeResult]) -> None:
        """Hand each result to its stream. Streams unregistered meanwhile are skipped."""
        if len(results) != len(batch.requests):
            self.fail(batch, f"the engine returned {len(results)} results for {len(batch.requests)} windows")
            return
        self.outcomes += len(results)
        for client, result in zip(batch.clients, results, strict=True):
            if client in self._rotation:
                client.receive_decode_result(result)

    def deliver_retried(self, batch: Batch, results: Sequence[DecodeResult | None]) -> None:
        """After the batch raised and each window was decoded alone: hand each stream its window's result, or its
        failure when the window failed alone too. Streams unregistered meanwhile are skipped."""
        self.outcomes += len(batch.requests)
        for client, request, result in zip(batch.clients, batch.requests, results, strict=True):
            if client not in self._rotation:
                continue
            if result is None:
                client.receive_decode_failure(request.request_id, _ENGINE_FAILED)
            else:
                client.receive_decode_result(result)

    def fail(self, batch: Batch, reason: str) -> None:
        """Tell every stream of a failed batch that its window is lost; the next batch runs as usual."""
        self.metrics.batch_failures.inc()
        self.outcomes += len(batch.requests)
        for client, request in zip(batch.clients, batch.requests, strict=True):
            if client in self._rotation:
                client.receive_decode_failure(request.request_id, reason)

    # -- running ----------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread and the scheduling task on the running loop."""
        if self._task is not None:
            raise InvalidState("the scheduler is already running")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamer-engine")
        self._task = asyncio.get_running_loop().create_task(self.run(), name="streamer-scheduler")

    async def stop(self) -> None:
        """Stop scheduling; a batch in flight finishes on its thread first, then the thread exits."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._executor is not None:
            executor, self._executor = self._executor, None
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown)

    def _decode_on(self, threads: int | None, requests: Sequence[DecodeRequest]) -> Decoded:
        """On the worker thread: take ``threads`` (if given), then :meth:`decode_isolating`."""
        if threads is not None:
            self._set_threads(threads)
        return self.decode_isolating(requests)

    def decode_isolating(self, requests: Sequence[DecodeRequest]) -> Decoded:
        """Decode a batch; if it raises, decode each window alone, in order, so that one window the engine cannot
        decode fails alone. Blocks: call on the worker thread only (:meth:`run` does). A batch of one window is not
        tried again: it already ran alone."""
        try:
            return Decoded(tuple(self.engine.decode(requests)))
        except Exception:
            logger.exception("engine.decode failed on a batch of %d windows", len(requests))
        if len(requests) == 1:
            return Decoded((None,), retried=False, failed_calls=1)
        results: list[DecodeResult | None] = []
        for request in requests:
            try:
                [result] = self.engine.decode([request])
            except Exception:
                logger.exception("engine.decode failed on window %d of %s alone", request.request_id, request.stream_id)
                results.append(None)
            else:
                results.append(result)
        return Decoded(tuple(results), retried=True, failed_calls=1 + results.count(None))

    async def run(self) -> None:
        """Form and decode batches until cancelled. One batch at a time; each window's stream hears back."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            raise InvalidState("call start(), which creates the worker thread, instead of run()")
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch = self.next_batch()
            if batch is None:
                continue
            # more work may be waiting behind this batch: look again as soon as it is done
            self._wakeup.set()
            started = time.perf_counter()
            attributes: dict[str, AttributeValue] = {
                "streamer.windows": len(batch.requests),
                "streamer.audio_seconds": samples_to_seconds(batch.audio_samples),
                "streamer.streams": [str(c.stream_id) for c in batch.clients],
            }
            threads = self.threads() if self.threads is not None else None
            if threads is not None:
                attributes["streamer.threads"] = threads
                self.metrics.engine_threads.set(threads)
            try:
                with self.tracer.span("streamer.batch", attributes):
                    decoding = loop.run_in_executor(self._executor, self._decode_on, threads, batch.requests)
                    decoded = await asyncio.shield(decoding)
            except asyncio.CancelledError:
                self.fail(batch, "the server is shutting down")
                raise
            finally:
                self.metrics.engine_busy_seconds.inc(time.perf_counter() - started)
            if decoded.failed_calls:
                # the batch raised: each stream hears its window's fate alone; details stay in the log
                self.metrics.batch_failures.inc(decoded.failed_calls)
                if decoded.retried:
                    self.metrics.windows_retried.inc(len(batch.requests))
                decoded_alone = len(decoded.results) - decoded.results.count(None)
                self.metrics.batches.inc(decoded_alone)
                self.metrics.windows.inc(decoded_alone)
                self.deliver_retried(batch, decoded.results)
                continue
            results = [r for r in decoded.results if r is not None]
            self.metrics.batches.inc()
            self.metrics.windows.inc(len(batch.requests))
            self.metrics.observe_batch(time.perf_counter() - started, [r.timings for r in results])
            logger.debug(
                "decoded batch of %d windows (%.2f s of audio) in %.3f s",
                len(batch.requests),
                samples_to_seconds(batch.audio_samples),
                time.perf_counter() - started,
            )
            self.deliver(batch, results)
