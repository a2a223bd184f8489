"""What a client needs to carry one session across dropped connections, sans-I/O: the audio no final covers yet,
the back-off between attempts, and the bookkeeping that makes the resume exact.

A ``/v1/listen`` client (:mod:`streamer.client`, ``streamer stream``; ``streamer/web/connection.js`` is the same
logic in the browser) keeps three things while it streams:

- an :class:`AudioRing`: the bytes it sent, indexed by *frame* (one sample per channel, in the rate and encoding it
  declared), from :data:`CONTEXT_SECONDS` before the end of the last final it received on each channel up to the
  newest (a replica taking the session over re-reads the open utterance from its start: that audio is context, not
  transcribed again). At most :attr:`ReconnectOptions.buffer_seconds` are kept: when more arrive, the oldest are
  dropped; the resume says where the ring now starts (``resend_from``), and only audio that no final covers is lost
  if a resume asks for it (:meth:`AudioRing.replay` names the range);
- a :class:`SessionCursor`: the session's id, the seq of the last final received (finals at or below it are
  duplicates, dropped), and where the current server session sits in the client's timeline (after a resume was
  refused and a new session took over, its stream time and seqs are shifted to continue the first ones);
- a :class:`Backoff`: jittered exponential delays between attempts, bounded in attempts and in total time;
- a :class:`SendLog`: when it first sent each frame, on its own clock, so that a final's arrival gives the delay the
  speaker felt (from the sending of the audio of its last word; the server's ``latency_ms`` is only its share). A
  resend after a resume leaves it as it was: the speaker spoke the audio when it was first sent.

When the connection drops, the client reconnects with ``?resume=<session_id>&last_seq=<n>&resend_from=<s>``
(through any replica; with ``--redis`` any one can take the session over), receives the finals after ``n``, and
sends the audio again from the frame the server names in ``ready`` (:meth:`SessionCursor.resume_frame`). If the
session cannot be resumed (``unknown_session``, close 4404), it starts a new one and sends the audio from the end of
the last final (:meth:`SessionCursor.restart`). Nothing here awaits, sleeps or reads the clock: ``now`` and the
random source are arguments.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass, field, replace

from streamer.core.audio import AudioFormat
from streamer.core.errors import ConfigError, InvalidState
from streamer.server.server_messages import (
    ErrorMessage,
    FinalMessage,
    LostRange,
    PartialMessage,
    Ready,
    ServerMessage,
    SpeechStartedMessage,
)

__all__ = [
    "CONTEXT_SECONDS",
    "RECONNECT_CLOSE_CODES",
    "SEND_LOG_SECONDS",
    "AudioRing",
    "Backoff",
    "ReconnectOptions",
    "Replay",
    "SendLog",
    "SessionCursor",
    "should_reconnect",
]

# Close codes after which the session may live on: the connection broke (1006: no close frame, e.g. a replica that
# died or a proxy that cut the TCP connection), the server went away (1001 shutting_down), failed (1011), restarts
# (1012), is full (1013: another replica may have room) or a gateway failed (1014). Any other code is the server's
# last word on the session (1000 after done, 44xx: the client must change what it sends, 1009 too large).
RECONNECT_CLOSE_CODES = frozenset({1001, 1006, 1011, 1012, 1013, 1014})


# A replica taking the session over names a resume_from up to this much before the end of the last final: the open
# utterance's context, which its windows re-read (one model window at most; docs/protocol.md, Resume). The ring keeps
# it, within buffer_seconds.
CONTEXT_SECONDS = 30.0


# The send log keeps at most this much audio behind the newest frame sent, whatever the finals say (bounded memory
# through a long silence, which brings no final): a final refers to audio of its open utterance, seconds old at real
# time. Only a file sent far faster than real time to a slow server has finals past it, whose delay a speaker never
# felt anyway: they go unmeasured.
SEND_LOG_SECONDS = 600.0


def should_reconnect(close_code: int | None) -> bool:
    """Whether a connection that closed with ``close_code`` (None: no close frame) is worth a resume."""
    return close_code is None or close_code in RECONNECT_CLOSE_CODES


@dataclass(frozen=True)
class ReconnectOptions:
    """How a client resumes its session after a dropped connection. Validated in :meth:`validate`."""

    # Audio kept for a resume, from CONTEXT_SECONDS before the last final: 60 s holds that context and 30 s after
    # the last final (the server's resume grace), and at 16 kHz PCM16 mono it is 1.9 MB. Past it the oldest audio
    # is dropped: context first, then audio no final covers, reported lost if a resume needs it.
    buffer_seconds: float = 60.0
    # Delay before the first attempt; each further attempt doubles it (multiplier) up to max_delay.
    first_delay: float = 0.25
    multiplier: float = 2.0
    max_delay: float = 5.0
    # Each delay is drawn in [(1 - jitter) * d, d], so that clients cut at once by a dead replica do not all come
    # back in the same instant (AWS's "equal jitter" at 0.5).
    jitter: float = 0.5
    # Give up after this many attempts in a row without a `ready`, or this many seconds since the connection
    # dropped, whichever comes first: 10 attempts take about 30 s, the server's default resume grace.
    max_attempts: int = 10
    max_seconds: float = 60.0

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.ConfigError` naming the first invalid field."""
        if not self.buffer_seconds > 0:
            raise ConfigError("buffer_seconds must be > 0")
        if not 0 < self.first_delay <= self.max_delay:
            raise ConfigError("first_delay must be > 0 and at most max_delay")
        if self.multiplier < 1:
            raise ConfigError("multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigError("jitter must be between 0 and 1")
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be at least 1")
        if not self.max_seconds > 0:
            raise ConfigError("max_seconds must be > 0")


class Backoff:
    """The delays between reconnection attempts after one drop. Call :meth:`next_delay` before each attempt and
    :meth:`reset` once a connection is ready again."""

    def __init__(self, options: ReconnectOptions, rng: random.Random | None = None) -> None:
        options.validate()
        self.options = options
        self._rng = rng or random.Random()
        self.attempts = 0
        self._since: float | None = None

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before the next attempt, or None when the bounds are reached: the caller gives up."""
        if self._since is None:
            self._since = now
        options = self.options
        if self.attempts >= options.max_attempts or now - self._since >= options.max_seconds:
            return None
        ceiling = min(options.max_delay, options.first_delay * options.multiplier**self.attempts)
        self.attempts += 1
        delay = ceiling * (1.0 - options.jitter * self._rng.random())
        # never past the time bound: the last attempt is made at it, not after it
        return min(delay, max(0.0, self._since + options.max_seconds - now))

    def reset(self) -> None:
        """A connection is ready: the next drop starts over from ``first_delay``."""
        self.attempts = 0
        self._since = None


@dataclass(frozen=True)
class Replay:
    """What to send a server that asked for the audio from frame ``start``: ``silence`` frames the ring no longer
    held (lost: they are sent as silence, so that stream time stays exact), then ``data``."""

    start: int
    silence: int
    data: bytes


class AudioRing:
    """The audio a client sent and may have to send again, as the bytes it sent, indexed by frame.

    :meth:`append` each chunk as it is sent, :meth:`release` what a final covers, :meth:`replay` on a resume. Holds
    at most ``capacity`` frames: past that the oldest are dropped (:attr:`dropped` counts them)."""

    def __init__(self, capacity: int, frame_bytes: int) -> None:
        if capacity < 1 or frame_bytes < 1:
            raise ConfigError("an audio ring needs a capacity and a frame size of at least 1")
        self.capacity = capacity
        self.frame_bytes = frame_bytes
        self.start = 0  # the oldest frame held
        self.dropped = 0  # frames dropped for room before a final released them
        self._data = bytearray()  # CPython deletes from a bytearray's front without moving the rest

    @property
    def end(self) -> int:
        """Frames appended in all: the next chunk starts here."""
        return self.start + len(self._data) // self.frame_bytes

    def append(self, data: bytes) -> None:
        """Keep a chunk the client sends (whole frames; a partial frame is a bug in the caller)."""
        if len(data) % self.frame_bytes:
            raise InvalidState(f"audio chunks must hold whole frames of {self.frame_bytes} bytes, not {len(data)}")
        self._data += data
        over = len(self._data) // self.frame_bytes - self.capacity
        if over > 0:
            del self._data[: over * self.frame_bytes]
            self.start += over
            self.dropped += over

    def release(self, upto: int) -> None:
        """Frames before ``upto`` are final: the server will never ask for them again."""
        drop = min(upto, self.end) - self.start
        if drop > 0:
            del self._data[: drop * self.frame_bytes]
            self.start += drop

    def replay(self, start: int) -> Replay:
        """The audio from frame ``start`` on, with the frames no longer held before it counted as silence.
        ``start`` past the end (the server has more than the ring: it cannot) is refused."""
        if start > self.end:
            raise InvalidState(f"the server asks for frame {start}, past the {self.end} sent")
        silence = max(0, self.start - start)
        skip = max(0, start - self.start) * self.frame_bytes
        return Replay(start=start, silence=silence, data=bytes(self._data[skip:]))


class SendLog:
    """When the client first sent each frame of its timeline, on its own monotonic clock.

    :meth:`record` each chunk when the caller hands it over (a resend after a resume is not recorded: the speaker
    spoke that audio when it first went out), :meth:`sent_at` the end of a final's last word when the final arrives
    (its seconds in the client's timeline, as :meth:`SessionCursor.receive` shifts them), and :meth:`prune` what no
    later final can refer to: the frames before the end of the last final of every channel. Holds one entry per
    chunk, at most :data:`SEND_LOG_SECONDS` of audio."""

    def __init__(self, sample_rate: int, horizon_seconds: float = SEND_LOG_SECONDS) -> None:
        if sample_rate < 1 or not horizon_seconds > 0:
            raise ConfigError("a send log needs a sample rate and a horizon above 0")
        self.sample_rate = sample_rate
        self.horizon = max(1, round(horizon_seconds * sample_rate))
        self.start = 0  # the first frame still held
        self.end = 0  # frames recorded in all
        # chunk i ends (exclusive) at frame _ends[i] and was sent at _times[i]; entries before _first are pruned
        # (the lists are compacted once half of them is dead, so a prune costs O(1) amortised)
        self._ends: list[int] = []
        self._times: list[float] = []
        self._first = 0

    def __len__(self) -> int:
        return len(self._ends) - self._first

    def record(self, frames: int, now: float) -> None:
        """The caller handed over ``frames`` more frames at ``now``."""
        if frames <= 0:
            return
        self.end += frames
        self._ends.append(self.end)
        self._times.append(now)
        self.prune(self.end - self.horizon + 1)  # the chunk holding the horizon's first frame stays

    def sent_at(self, seconds: float) -> float | None:
        """When the audio ending at ``seconds`` of the client's timeline was sent: the time of the chunk holding the
        frame just before it. None for audio no longer held, or not sent yet."""
        frame = max(0, round(seconds * self.sample_rate) - 1)
        if frame < self.start:
            return None
        index = bisect_right(self._ends, frame, lo=self._first)
        return self._times[index] if index < len(self._ends) else None

    def prune(self, upto: int) -> None:
        """No final will refer to audio ending before frame ``upto``: drop the chunks before the one holding
        ``upto - 1``."""
        while self._first < len(self._ends) and self._ends[self._first] < upto:
            self.start = self._ends[self._first]
            self._first += 1
        if self._first > 64 and 2 * self._first > len(self._ends):
            del self._ends[: self._first], self._times[: self._first]
            self._first = 0


@dataclass
class SessionCursor:
    """Where one client session stands across its connections: what to ask a resume for and where to send from.

    The server numbers finals 1, 2, 3, ... per server session; :attr:`last_seq` is the last one received in the
    current server session. The client's timeline starts at the first connection: after a refused resume, a new
    server session starts at frame :attr:`frame_base` of it, its finals numbered after :attr:`seq_base`, and
    :meth:`receive` shifts them so that the caller sees one session."""

    audio: AudioFormat
    session_id: str | None = None
    last_seq: int = 0  # in the current server session
    seq_base: int = 0  # finals of earlier server sessions
    frame_base: int = 0  # where the current server session's stream time 0 sits in the client's frames
    committed: dict[int, int] = field(default_factory=dict)  # per channel: the end of its last final, in frames
    duplicates: int = 0  # finals dropped because their seq was already received
    lost: list[LostRange] = field(default_factory=list)  # audio a resume asked for that the ring no longer had

    def resume_query(self, oldest: int = 0) -> str:
        """The query parameters that ask to resume, without ``?`` or ``&``; empty before the first ``ready``.
        ``oldest``: the first frame the ring still holds (:attr:`AudioRing.start`), so that a replica taking the
        session over asks for no context before it."""
        if self.session_id is None:
            return ""
        query = f"resume={self.session_id}&last_seq={self.last_seq}"
        held = max(0, oldest - self.frame_base)
        if held:  # six decimals name a frame exactly at every rate up to 1 MHz
            query += f"&resend_from={held / self.audio.sample_rate:.6f}"
        return query

    def committed_point(self) -> int:
        """The frame before which every channel's audio is in a final received (0 while a channel has none)."""
        return min(self.committed.get(channel, 0) for channel in range(self.audio.channels))

    def release_point(self) -> int:
        """The frame before which no resume will ask for audio again: the ring keeps what follows. That is
        :data:`CONTEXT_SECONDS` before :meth:`committed_point`, where a takeover's context may start."""
        margin = round(CONTEXT_SECONDS * self.audio.sample_rate)
        return max(0, self.committed_point() - margin)

    def ready(self, ready: Ready) -> None:
        """A connection is ready: remember the session (a new one, or the same one resumed)."""
        if self.session_id is not None and ready.resumed and ready.session_id != self.session_id:
            raise InvalidState(f"resumed {ready.session_id}, not {self.session_id}")
        self.session_id = ready.session_id

    def resume_frame(self, ready: Ready) -> int:
        """The client frame to send from after a resumed ``ready``: ``resume_from``, where the audio the session
        has ends (on the replica that kept it), or where everything is final (on one that took it over from Redis).
        """
        return self.frame_base + round(ready.resume_from * self.audio.sample_rate)

    def restart(self) -> int:
        """The session could not be resumed: the next ``ready`` starts a new server session at the end of the last
        final; its finals and times continue this one's. Returns that frame, where sending starts again."""
        self.session_id = None
        self.seq_base += self.last_seq
        self.last_seq = 0
        self.frame_base = self.committed_point()
        return self.frame_base

    def note_replay(self, replay: Replay) -> None:
        """Record the frames a replay had to send as silence as lost, those after the last final: before it, they
        were context for the server to re-read, transcribed already."""
        start = max(replay.start, self.committed_point())
        end = replay.start + replay.silence
        if end > start:
            rate = self.audio.sample_rate
            self.lost.append(LostRange(start / rate, end / rate))

    def receive(self, message: ServerMessage) -> ServerMessage | None:
        """A message from the server, in the client's timeline; None for a final already received (a duplicate)."""
        if isinstance(message, FinalMessage):
            if message.seq and message.seq <= self.last_seq:
                self.duplicates += 1
                return None
            self.last_seq = max(self.last_seq, message.seq)
        shifted = self._shift(message)
        if isinstance(shifted, FinalMessage):
            end = round(shifted.end * self.audio.sample_rate)
            self.committed[shifted.channel] = max(self.committed.get(shifted.channel, 0), end)
        return shifted

    def _shift(self, message: ServerMessage) -> ServerMessage:
        if not self.frame_base and not self.seq_base:
            return message
        seconds = self.frame_base / self.audio.sample_rate
        if isinstance(message, FinalMessage | PartialMessage):
            words = tuple(replace(w, start=w.start + seconds, end=w.end + seconds) for w in message.words)
            moved = replace(message, start=message.start + seconds, end=message.end + seconds, words=words)
            return replace(moved, seq=moved.seq + self.seq_base) if isinstance(moved, FinalMessage) else moved
        if isinstance(message, SpeechStartedMessage):
            return replace(message, start=message.start + seconds)
        if isinstance(message, ErrorMessage) and message.lost is not None:
            lost = LostRange(message.lost.start + seconds, message.lost.end + seconds)
            return replace(message, lost=lost)
        return message
