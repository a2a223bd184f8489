"""Sessions that outlive their connection: parked for a grace period, waiting for the client to resume them.

When a ``/v1/listen`` connection drops mid-stream (a network change, a proxy restart, a reset), the session keeps its
stream cores, its place with the scheduler and the finals the client may not have received, and parks itself here.
A client that reconnects within ``grace_seconds`` with ``?resume=<session_id>&last_seq=<n>`` claims it back
(:meth:`ResumeRegistry.claim`) and receives every final after ``n``; when the grace period ends unclaimed, the
registry expires the session, which then lets go of everything.

Across replicas (``--redis``): the registry is in memory, so a sibling replica knows nothing of a parked session,
but every session also keeps a :class:`SessionRecord` in a :class:`SessionStore`. With Redis
(:class:`RedisSessionStore`) the record holds the session's owner, its query, its seq, each channel's accounted
position (every sample before it is in a final, a non-speech span or a lost range) and its newest finals, written
in the background as they change (never waiting: :mod:`streamer.server.redis_link`) and kept for the resume grace after
the last write. Another replica takes the session over from it (:meth:`SessionStore.take_over`): new cores start at
the accounted position, the finals after ``last_seq`` are replayed, and ``ready`` tells the client where to send
its audio from (``resume_from``). Without Redis (:class:`LocalSessionStore`) nothing leaves the process and a resume
elsewhere gets ``unknown_session``; see ``docs/protocol.md``.

The registry never reads the clock itself: expiry is a ``loop.call_later`` timer, and the registry takes the
``call_later`` to use as an argument, so that tests move time themselves instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from streamer.core.errors import UnknownSession
from streamer.core.events import Final, Word
from streamer.core.units import N_SAMPLES
from streamer.server.auth import ANONYMOUS, Principal
from streamer.server.redis_link import RedisLink

__all__ = [
    "CallLater",
    "ChannelRecord",
    "KeptFinal",
    "LocalSessionStore",
    "Parkable",
    "Recorded",
    "RedisSessionStore",
    "ResumeRegistry",
    "SessionRecord",
    "SessionStore",
    "Timer",
]

logger = logging.getLogger(__name__)


class Parkable(Protocol):
    """A session as the registry sees it (:class:`streamer.server.session.Session`)."""

    @property
    def id(self) -> str: ...

    @property
    def owner(self) -> Principal:
        """Who opened the session: only that principal (or an admin) may resume it."""
        ...

    def check_resume(self, last_seq: int) -> None:
        """Raise :class:`~streamer.core.errors.UnknownSession` if the finals after ``last_seq`` cannot all be
        replayed."""
        ...

    def expire(self) -> None:
        """The grace period is over (or the server stops): let go of the cores and the scheduler; never raises."""
        ...


class Timer(Protocol):
    """A pending call, as ``loop.call_later`` returns it (:class:`asyncio.TimerHandle`)."""

    def cancel(self) -> None: ...


CallLater = Callable[[float, Callable[[str], None], str], Timer]
"""``loop.call_later(delay, callback, session_id)``: call ``callback(session_id)`` ``delay`` seconds from now."""


class ResumeRegistry:
    """The parked sessions of one server. Call on the event loop thread only. ``call_later`` schedules each grace
    period's end; by default the running loop's (tests pass one whose time they move)."""

    def __init__(self, call_later: CallLater | None = None) -> None:
        self._call_later = call_later
        self._parked: dict[str, tuple[Parkable, Timer]] = {}
        self.resumed = 0  # sessions claimed back, for the logs and tests
        self.expired = 0  # sessions whose grace period ended unclaimed

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._parked

    def park(self, session: Parkable, grace_seconds: float, limit: int | None = None) -> None:
        """Keep ``session`` for ``grace_seconds``; then call its :meth:`~Parkable.expire` unless claimed. With
        ``limit``, the oldest parked sessions expire first so that no more than ``limit`` are kept."""
        if session.id in self._parked:
            return
        while limit is not None and self._parked and len(self._parked) >= limit:
            self._expire(next(iter(self._parked)))
        call_later = self._call_later or asyncio.get_running_loop().call_later
        timer = call_later(grace_seconds, self._expire, session.id)
        self._parked[session.id] = (session, timer)
        logger.info("session=%s event=parked grace_s=%g", session.id, grace_seconds)

    def claim(self, session_id: str, last_seq: int, principal: Principal = ANONYMOUS) -> Parkable:
        """Take a parked session back for a new connection; raise :class:`~streamer.core.errors.UnknownSession` when
        there is none by that id (never was, already resumed, or expired), it belongs to another principal than
        ``principal`` (answered the same, so that ids say nothing to those who do not own them), or it cannot
        replay from ``last_seq``; the session then stays parked. The caller attaches the connection at once."""
        entry = self._parked.get(session_id)
        if entry is None or not principal.owns(entry[0].owner):
            raise UnknownSession("no session to resume by that id: it ended, expired, or was resumed already")
        session, timer = entry
        session.check_resume(last_seq)
        del self._parked[session_id]
        timer.cancel()
        self.resumed += 1
        return session

    def forget(self, session_id: str) -> None:
        """Expire ``session_id`` now if it is parked here: another replica took it over (its record says so)."""
        self._expire(session_id)

    def close(self) -> None:
        """The server is stopping: expire every parked session now (nobody could resume them after the stop)."""
        for session_id in list(self._parked):
            self._expire(session_id)

    def _expire(self, session_id: str) -> None:
        entry = self._parked.pop(session_id, None)
        if entry is None:
            return
        session, timer = entry
        timer.cancel()
        self.expired += 1
        session.expire()


# ---------------------------------------------------------------------------------------------------------------------
# The session's record, and where it is kept


@dataclass(frozen=True)
class ChannelRecord:
    """Where one channel of a session stands. Positions and spans are 16 kHz samples of stream time."""

    # every sample before this is in a final, a non-speech span or a lost range: a new core starts here
    accounted: int
    # the segment_id of the channel's next segment
    next_segment_id: int
    # the accounting so far, for `done`
    transcribed: int = 0
    non_speech: int = 0
    lost: int = 0
    # where the core's next window would start re-reading (StreamCore.context_start, at or before `accounted`): a
    # new core is fed the audio from here as context, so that it decodes the open utterance as the old one would;
    # None: `accounted` (a record written before issue 18's fix)
    context_start: int | None = None

    @property
    def replay_from(self) -> int:
        """Where a core taking this channel over is fed audio from: :attr:`context_start`, never more than one
        model window (30 s) before :attr:`accounted` nor after it."""
        start = self.accounted if self.context_start is None else self.context_start
        return min(self.accounted, max(start, self.accounted - N_SAMPLES, 0))


@dataclass(frozen=True)
class KeptFinal:
    """A final a resuming client may not have received."""

    seq: int
    channel: int
    final: Final


@dataclass(frozen=True)
class SessionRecord:
    """What another process needs to take a ``/v1/listen`` session over (see the module docstring)."""

    session_id: str
    owner: Principal
    # the first connection's query string (ListenParams.to_query): the audio format, channels, language
    query: str
    # the seq of the session's last final
    seq: int
    channels: tuple[ChannelRecord, ...]
    # the newest finals, seq ascending, the last one numbered `seq` (older ones were acknowledged or forgotten)
    finals: tuple[KeptFinal, ...] = ()

    def check_resume(self, last_seq: int) -> None:
        """Raise :class:`~streamer.core.errors.UnknownSession` unless every final after ``last_seq`` is here: the
        client cannot have more finals than the record (it was written before they were sent, or the resume would
        repeat them) and the record must hold every one it lacks (a write lost while Redis was down leaves a hole)."""
        wanted = [f.seq for f in self.finals if f.seq > last_seq]
        if last_seq > self.seq or wanted != list(range(last_seq + 1, self.seq + 1)):
            raise UnknownSession(f"cannot resume from last_seq {last_seq}: the shared record cannot replay it exactly")

    def state_json(self) -> str:
        """Everything but the finals, as JSON (the finals go one JSON object each: :meth:`final_json`)."""
        channels = [
            [c.accounted, c.next_segment_id, c.transcribed, c.non_speech, c.lost, c.replay_from] for c in self.channels
        ]
        state = {
            "id": self.session_id,
            "owner": [self.owner.key_id, self.owner.admin],
            "query": self.query,
            "seq": self.seq,
            "channels": channels,
        }
        return json.dumps(state, separators=(",", ":"))

    @staticmethod
    def final_json(kept: KeptFinal) -> str:
        f = kept.final
        # a diarized word carries its speaker as a fifth element
        words = [
            [w.text, w.start, w.end, round(w.probability, 4)] + ([] if w.speaker is None else [w.speaker])
            for w in f.words
        ]
        body = [kept.seq, kept.channel, f.segment_id, f.text, f.start, f.end, f.audio_end, words]
        if f.speaker is not None:
            body.append(f.speaker)
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, state: str, finals: list[str]) -> SessionRecord:
        """The record :meth:`state_json` and :meth:`final_json` wrote; ValueError (or KeyError, TypeError) if it is
        not one."""
        data = json.loads(state)
        kept: list[KeptFinal] = []
        for text in finals:
            seq, channel, segment_id, body, start, end, audio_end, words, *speaker = json.loads(text)
            parsed = tuple(
                Word(str(w[0]), int(w[1]), int(w[2]), float(w[3]), int(w[4]) if len(w) > 4 else None) for w in words
            )
            final = Final(int(segment_id), str(body), start, end, parsed, audio_end)
            if speaker:
                final = replace(final, speaker=int(speaker[0]))
            kept.append(KeptFinal(int(seq), int(channel), final))
        key_id, admin = data["owner"]
        return cls(
            session_id=str(data["id"]),
            owner=Principal(str(key_id), bool(admin)),
            query=str(data["query"]),
            seq=int(data["seq"]),
            channels=tuple(ChannelRecord(*(int(v) for v in c)) for c in data["channels"]),
            finals=tuple(sorted(kept, key=lambda k: k.seq)),
        )


class Recorded(Protocol):
    """A session as its store sees it (:class:`streamer.server.session.Session`)."""

    @property
    def id(self) -> str: ...

    def record(self) -> SessionRecord:
        """The session as of now."""
        ...


class SessionStore(Protocol):
    """Where sessions keep their records for other processes. Call on the event loop thread."""

    def save(self, session: Recorded) -> None:
        """``session`` changed (a final, an accounted span, a park): keep its record. Never waits."""
        ...

    def drop(self, session_id: str) -> None:
        """The session ended here: nobody may resume it any more. Never waits."""
        ...

    async def elsewhere(self, session_id: str) -> bool:
        """Whether another process took ``session_id`` over since this one last wrote its record (a session parked
        here is then stale: resume it from the record)."""
        ...

    async def take_over(self, session_id: str, last_seq: int, principal: Principal) -> SessionRecord:
        """Claim the record of ``session_id`` for this process, which then continues the session; raise
        :class:`~streamer.core.errors.UnknownSession` when there is none, it belongs to another principal, it cannot
        replay from ``last_seq``, or the store cannot be reached."""
        ...


class LocalSessionStore:
    """:class:`SessionStore` of a server alone (no ``--redis``): nothing leaves the process, so only the replica that
    holds a parked session can resume it (:class:`ResumeRegistry`)."""

    def save(self, session: Recorded) -> None:
        return None

    def drop(self, session_id: str) -> None:
        return None

    async def elsewhere(self, session_id: str) -> bool:
        return False

    async def take_over(self, session_id: str, last_seq: int, principal: Principal) -> SessionRecord:
        raise UnknownSession("no session to resume by that id: it ended, expired, or was resumed already")


# KEYS: the record's hash, its list of finals. ARGV: this replica, the TTL in ms, the state, the seq the list ends
# with as this writer last wrote it ("" for none), whether to replace the list ("1"), the finals to keep at most, the
# seq the list ends with after this write, then the finals to append. -2: another replica took the session over;
# -1: the list is not as this writer left it (it expired, or Redis lost it): write it whole.
_WRITE = """
local replica = redis.call('HGET', KEYS[1], 'replica')
if replica and replica ~= ARGV[1] then return -2 end
if ARGV[5] == '1' then
  redis.call('DEL', KEYS[2])
elseif (redis.call('HGET', KEYS[1], 'pushed') or '') ~= ARGV[4] then
  return -1
end
for i = 8, #ARGV do redis.call('RPUSH', KEYS[2], ARGV[i]) end
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[6]), -1)
redis.call('HSET', KEYS[1], 'replica', ARGV[1], 'state', ARGV[3], 'pushed', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""

# KEYS: the hash, the list. ARGV: the replica taking over, the state it read. 0 when the record changed meanwhile.
_CLAIM = """
if redis.call('HGET', KEYS[1], 'state') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'replica', ARGV[1])
return 1
"""

# KEYS: the hash, the list. ARGV: this replica. Deletes the record unless another replica owns it now.
_DROP = """
local replica = redis.call('HGET', KEYS[1], 'replica')
if replica and replica ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
"""


class RedisSessionStore:
    """:class:`SessionStore` in Redis, shared by every replica: ``<prefix>session:<id>`` (a hash: the replica that
    writes it, the state as JSON, the seq of the last final listed) and ``<prefix>session:<id>:finals`` (a list of
    the newest finals, one JSON array each), both expiring ``ttl`` seconds after the last write. Writes go through
    the link's coalescing queue (:meth:`~streamer.server.redis_link.RedisLink.mark`); a replica whose session was taken
    over elsewhere stops writing it and ``superseded(session_id)`` is called."""

    def __init__(self, link: RedisLink, ttl: float, keep: int, superseded: Callable[[str], None] | None = None) -> None:
        self.link = link
        self.ttl_ms = max(1, int(ttl * 1000))
        self.keep = keep
        self.superseded = superseded
        # the seq each session's list ends with, as this replica last wrote it
        self._pushed: dict[str, int] = {}
        self._write = link.client.register_script(_WRITE)
        self._claim = link.client.register_script(_CLAIM)
        self._drop = link.client.register_script(_DROP)
        self.taken_over = 0  # sessions this replica took over from a record
        # a record written while Redis was down is written again once it is back: the link retries marked writes

    def _keys(self, session_id: str) -> list[str]:
        hash_key = self.link.key("session", session_id)
        return [hash_key, hash_key + ":finals"]

    def save(self, session: Recorded) -> None:
        session_id = session.id

        async def write(client: Any) -> None:
            record = session.record()
            pushed = self._pushed.get(session_id)
            result = await self._send(record, pushed)
            if result == -1:
                result = await self._send(record, None)
            if result == -2:
                self._pushed.pop(session_id, None)
                logger.info("session=%s event=taken_over_elsewhere", session_id)
                if self.superseded is not None:
                    self.superseded(session_id)
                return
            self._pushed[session_id] = record.seq

        self.link.mark(self.link.key("session", session_id), write)

    async def _send(self, record: SessionRecord, pushed: int | None) -> int:
        """One write of ``record``: the finals after ``pushed``, or all of them (None)."""
        whole = pushed is None or (bool(record.finals) and record.finals[0].seq > pushed + 1)
        finals = [f for f in record.finals if whole or f.seq > (pushed or 0)]
        args = [
            self.link.replica,
            self.ttl_ms,
            record.state_json(),
            "" if pushed is None else str(pushed),
            "1" if whole else "0",
            self.keep,
            str(record.seq),
            *(SessionRecord.final_json(f) for f in finals),
        ]
        return int(await self._write(keys=self._keys(record.session_id), args=args))

    def drop(self, session_id: str) -> None:
        self._pushed.pop(session_id, None)
        self.link.unmark(self.link.key("session", session_id))
        keys = self._keys(session_id)

        async def drop(client: Any) -> None:
            await self._drop(keys=keys, args=[self.link.replica])

        self.link.submit(drop)

    async def elsewhere(self, session_id: str) -> bool:
        key = self._keys(session_id)[0]

        async def replica(client: Any) -> str | None:
            value: str | None = await client.hget(key, "replica")
            return value

        writer = await self.link.call(replica, None)
        return writer is not None and writer != self.link.replica

    async def take_over(self, session_id: str, last_seq: int, principal: Principal) -> SessionRecord:
        gone = UnknownSession("no session to resume by that id: it ended, expired, or was resumed already")
        keys = self._keys(session_id)

        async def load(client: Any) -> tuple[str | None, list[str]]:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hget(keys[0], "state")
                pipe.lrange(keys[1], 0, -1)
                state, finals = await pipe.execute()
            return state, finals

        async def claim(client: Any) -> int:
            return int(await self._claim(keys=keys, args=[self.link.replica, state]))

        nothing: tuple[str | None, list[str]] = (None, [])
        for _ in range(3):  # the owner may write between the read and the claim: read again
            state, finals = await self.link.call(load, nothing)
            if state is None:
                raise gone
            try:
                record = SessionRecord.from_json(state, finals)
            except (ValueError, KeyError, TypeError):
                logger.warning("session=%s event=bad_record", session_id)
                raise gone from None
            if not principal.owns(record.owner):
                raise gone
            record.check_resume(last_seq)
            if await self.link.call(claim, -1) == 1:
                self._pushed.pop(session_id, None)  # the next write is whole, from this replica
                self.taken_over += 1
                return record
        raise gone
