"""The link to Redis, where replicas share state (``streamer serve --redis URL``), and how a server lives without it.

Several replicas behind a load balancer share four things through Redis (``docs/operations.md`` lists the keys):
each ``/v1/listen`` session's record, so that any replica can take over a resume
(:class:`~streamer.server.resume.RedisSessionStore`); each call's events, so that a follower on any replica sees a
call streaming into any other (:class:`~streamer.integrations.hub_redis.RedisCallHub`); and the single-use browser
tokens and Twilio calls already seen (:class:`RedisOnce`). Everything has an in-process implementation too, the
default without ``--redis``.

Redis trouble is not an outage. The audio path never waits on Redis: it hands writes to :class:`RedisLink`, which
keeps them in a bounded queue that one background task drains; a write that does not fit is dropped and counted
(``streamer_redis_writes_dropped_total``), and a session's record, whose writes are coalesced per session, is simply
written again once Redis answers. What waits on Redis (redeeming a token, taking a session over) waits at most
``command_timeout`` and then does without it. While Redis is down (refused, timed out, or too slow), the link says so
in ``/readyz``'s body, ``streamer_redis_up`` and the log, serves from the process alone (a resume then works on the
replica that holds the session, a token is single-use per process), and tries Redis again every ``retry_seconds``:
when it answers, the link is up again and the queued records go out.

The ``redis`` package (PyPI, its asyncio API) is imported only when ``--redis`` is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamer.core.errors import ConfigError

__all__ = [
    "REDIS_URL_ENV",
    "LocalOnce",
    "Once",
    "RedisLink",
    "RedisMetrics",
    "RedisOnce",
    "RedisOptions",
    "Write",
    "connect",
]

logger = logging.getLogger(__name__)

REDIS_URL_ENV = "STREAMER_REDIS_URL"

T = TypeVar("T")

# A write for the drainer: a coroutine function of the client. It raises on Redis trouble (the link goes down).
Write = Callable[[Any], Awaitable[object]]


@dataclass(frozen=True)
class RedisOptions:
    """The link to Redis. Validated in :meth:`validate`."""

    # redis://[:password@]host:port/db (rediss:// for TLS); None: no Redis, everything in-process
    url: str | None = None
    # writes waiting for Redis (call events, mostly: records are coalesced per session); beyond, dropped and counted
    queue: int = 10000
    # seconds a command may take: past it, Redis counts as down (a slow Redis must not hold anything up)
    command_timeout: float = 0.5
    # seconds between attempts to reach Redis again while it is down
    retry_seconds: float = 1.0
    # prefix of every key, so that several deployments can share one Redis
    prefix: str = "streamer:"

    @property
    def enabled(self) -> bool:
        return self.url is not None

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if self.url is not None and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigError("the Redis URL must start with redis://, rediss:// or unix://")
        if self.queue < 1:
            raise ConfigError("redis queue must be >= 1")
        if self.command_timeout <= 0 or self.retry_seconds <= 0:
            raise ConfigError("redis command_timeout and retry_seconds must be > 0")


def connect(url: str, timeout: float) -> Any:
    """A ``redis.asyncio.Redis`` client of ``url`` whose every command gives up after ``timeout`` seconds, without
    retries (the link retries on its own schedule). Raise :class:`~streamer.core.errors.ConfigError` when the
    ``redis`` package is missing."""
    try:
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
    except ImportError:
        raise ConfigError(
            "--redis needs the redis package: pip install 'streamer[redis]' (or pip install redis)"
        ) from None
    return redis.asyncio.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


class RedisLink:
    """The server's connection to Redis, its health, and the background task that drains its writes.

    :meth:`start` once the event loop runs, :meth:`stop` at shutdown. Everything else is called on the loop thread:
    :meth:`submit` and :meth:`mark` never wait; :meth:`call` waits at most ``command_timeout``.
    """

    def __init__(self, options: RedisOptions, client: Any = None) -> None:
        options.validate()
        if client is None:
            assert options.url is not None, "RedisLink needs a URL"
            client = connect(options.url, options.command_timeout)
        self.options = options
        self.client = client
        # this process among the replicas: a session's record names the replica that writes it
        self.replica = secrets.token_hex(6)
        self.up = False
        self.dropped = 0  # writes that did not fit the queue, or failed with Redis down
        self.failures = 0  # times Redis stopped answering
        self._writes: deque[Write] = deque()
        # coalesced writes: one per key (a session's record), the newest state written when the drainer gets to it
        self._marked: OrderedDict[str, Write] = OrderedDict()
        self._wake = asyncio.Event()
        self._writing = False  # a write is in flight
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def key(self, *parts: str) -> str:
        """A key under the deployment's prefix: ``key("session", id)`` is ``streamer:session:<id>``."""
        return self.options.prefix + ":".join(parts)

    @property
    def queued(self) -> int:
        return len(self._writes) + len(self._marked)

    @property
    def settled(self) -> bool:
        """Everything handed to the link so far is written (or given up): nothing queued, nothing in flight."""
        return not self._writing and not self.queued

    @property
    def status(self) -> str:
        """One line for ``/readyz``'s body and the logs."""
        if self.up:
            return "redis up"
        return "redis down: resume, call followers and single-use tokens work within this replica only"

    # -- lifecycle --------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start draining (Redis need not be up: the link tries until it is)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="redis-link")

    async def stop(self) -> None:
        """Write what is queued, within a few command timeouts, then close the connections."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout=4 * self.options.command_timeout + 1.0)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            await self.client.aclose()

    # -- writes that never wait --------------------------------------------------------------------------------------

    def submit(self, write: Write) -> bool:
        """Queue ``write``; False (and counted) when the queue is full: the server goes on without it."""
        if len(self._writes) >= self.options.queue:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning("event=redis_queue_full dropped=%d", self.dropped)
            return False
        self._writes.append(write)
        self._wake.set()
        return True

    def mark(self, key: str, write: Write) -> None:
        """Write ``key`` soon with ``write``, replacing a write of the same key not yet made: a session's record is
        written whole, its newest state, however often it changed meanwhile. A write that fails stays marked (unless
        marked again) and goes out once Redis is back."""
        self._marked[key] = write
        self._wake.set()

    def unmark(self, key: str) -> None:
        self._marked.pop(key, None)

    # -- reads that wait, briefly ------------------------------------------------------------------------------------

    async def call(self, command: Callable[[Any], Awaitable[T]], fallback: T) -> T:
        """``command(client)``'s answer, or ``fallback`` when Redis is down, errs or is slower than
        ``command_timeout`` (the link then counts as down until it answers again)."""
        if not self.up:
            return fallback
        try:
            return await asyncio.wait_for(command(self.client), timeout=self.options.command_timeout)
        except Exception as error:  # any trouble with Redis: do without it
            self._down(error)
            return fallback

    # -- the drainer ------------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if not self.up:
                if self._stopping:
                    return
                await self._probe()
                if not self.up:
                    await self._pause(self.options.retry_seconds)
                    continue
            if not self._writes and not self._marked:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._drain_one()

    async def _probe(self) -> None:
        try:
            await asyncio.wait_for(self.client.ping(), timeout=self.options.command_timeout)
        except Exception:
            return
        self.up = True
        logger.info("event=redis_up queued=%d", self.queued)

    async def _drain_one(self) -> None:
        self._writing = True
        try:
            if self._marked:
                key, write = self._marked.popitem(last=False)
                try:
                    await asyncio.wait_for(write(self.client), timeout=self.options.command_timeout)
                except Exception as error:
                    self._marked.setdefault(key, write)  # a newer state marked meanwhile wins; else retry this one
                    self._marked.move_to_end(key, last=False)
                    self._down(error)
                return
            write = self._writes.popleft()
            try:
                await asyncio.wait_for(write(self.client), timeout=self.options.command_timeout)
            except Exception as error:
                self.dropped += 1
                self._down(error)
        finally:
            self._writing = False

    def _down(self, error: BaseException) -> None:
        if not self.up:
            return
        self.up = False
        self.failures += 1
        reason = type(error).__name__ if isinstance(error, TimeoutError) else f"{type(error).__name__}: {error}"
        logger.warning("event=redis_down reason=%r queued=%d", reason, self.queued)
        self._wake.set()

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` before the next attempt, or less if the server stops."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)


class RedisMetrics(Collector):
    """The link's health on ``GET /metrics``, read at scrape time."""

    def __init__(self, link: RedisLink) -> None:
        self.link = link

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        up, dropped, failures, queue = self._families()
        up.add_metric([], 1.0 if self.link.up else 0.0)
        dropped.add_metric([], self.link.dropped)
        failures.add_metric([], self.link.failures)
        queue.add_metric([], self.link.queued)
        return [up, dropped, failures, queue]

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("streamer_redis_up", "1 while Redis answers; 0 while the replica serves on its own."),
            CounterMetricFamily(
                "streamer_redis_writes_dropped",
                "Writes to Redis given up: the queue was full (a slow Redis) or Redis was down (degraded mode).",
            ),
            CounterMetricFamily("streamer_redis_failures", "Times Redis stopped answering (down, or too slow)."),
            GaugeMetricFamily(
                "streamer_redis_queue_depth", "Writes waiting for Redis (records coalesced per session)."
            ),
        )


# ---------------------------------------------------------------------------------------------------------------------
# Things that may happen once: a token's redemption, a Twilio call's start


class Once(Protocol):
    """Remembers keys until they expire; :meth:`first` says whether a key is new, and remembers it."""

    async def first(self, key: str, expires: float) -> bool:
        """True the first time ``key`` is seen before ``expires`` (Unix seconds, wall clock); False after."""
        ...


class LocalOnce:
    """:class:`Once` within this process (the default, and the fallback while Redis is down)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._seen: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def first_now(self, key: str, expires: float) -> bool:
        """:meth:`first`, without an event loop."""
        now = self.clock()
        # an expired key needs no remembering: what it names is refused by its expiry anyway. Keys come with about
        # the same lifetime, so the oldest are at the front
        while self._seen and next(iter(self._seen.values())) <= now:
            del self._seen[next(iter(self._seen))]
        if key in self._seen and self._seen[key] > now:
            return False
        self._seen[key] = expires
        return True

    async def first(self, key: str, expires: float) -> bool:
        return self.first_now(key, expires)


class RedisOnce:
    """:class:`Once` across replicas: ``SET key 1 NX EXAT expires``. While Redis is down or slow, it falls back on
    this process's memory, which also remembers every key it sees, so that a key used while Redis was down is not
    new to this replica once it is back."""

    def __init__(self, link: RedisLink, namespace: str, local: LocalOnce | None = None) -> None:
        self.link = link
        self.namespace = namespace
        self.local = local or LocalOnce()

    async def first(self, key: str, expires: float) -> bool:
        locally = self.local.first_now(key, expires)
        name = self.link.key(self.namespace, key)
        at = max(int(expires) + 1, 1)

        async def set_nx(client: Any) -> bool | None:
            return bool(await client.set(name, "1", nx=True, exat=at))

        shared = await self.link.call(set_nx, None)
        return locally if shared is None else (locally and shared)
