"""How a ``/v1/listen`` connection opens its session (:func:`open_listen_session`): a new one, a parked one resumed,
or one continued in this process from the record another replica kept of it (:class:`Takeover`, and
:mod:`streamer.server.resume`): where each channel's new core starts, and from which frame the client resends.

Resume: when the connection drops mid-stream, the session parks itself in the server's
:class:`~streamer.server.resume.ResumeRegistry` for ``resume_grace_seconds`` instead of ending. Its cores stay
registered with the scheduler, finals keep their ``seq`` and stay in :attr:`~streamer.server.session.Session.finals`
(the last ``resume_finals`` of them), and a connection that comes back with ``?resume=<id>&last_seq=<n>``
(:func:`open_listen_session`) is attached to the same session: ``ready`` with ``resumed: true``, every final after
``n``, then the stream goes on where it was.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from streamer.core.errors import DiarizationUnavailable, ProtocolError, UnknownSession
from streamer.core.options import CoreOptions
from streamer.core.origin import StreamOrigin
from streamer.core.units import SAMPLE_RATE
from streamer.engine.types import check_supported
from streamer.server.auth import Principal
from streamer.server.listen_query import LISTEN_PATH, ListenParams, parse_listen_query, parse_resume_query
from streamer.server.metrics import ServerMetrics
from streamer.server.resume import ResumeRegistry, SessionRecord, SessionStore
from streamer.server.scheduler import Scheduler
from streamer.server.session import Session
from streamer.server.session_options import SessionOptions
from streamer.server.speaker_worker import DIARIZATION_UNAVAILABLE, SpeakerWorker

__all__ = ["Takeover", "open_listen_session"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Takeover:
    """A session continued from its record (another process ran it until its connection dropped; see
    :mod:`streamer.server.resume`).

    Each channel's new core starts its accounting exactly where the record's ends (``accounted``) and is fed the
    audio from the record's ``replay_from`` (the open utterance's context, at most 30 s before) so that it decodes
    that utterance as the old core would have (issue 18). The client resends its audio from the frame
    :attr:`resume_frame`: a frame on the client's clock that falls on a 16 kHz sample (16000 / gcd(rate, 16000)
    samples apart: 1 at 48 kHz, 2 at 8 kHz, 160 at 44.1 kHz), at or before every channel's accounted position, at
    or after the oldest frame the client still holds (``resend_from``) when it can be; each channel drops what it
    resends before its own replay start (:meth:`replay_from`)."""

    record: SessionRecord
    # the seq of the last final the client received: the finals after it are replayed
    last_seq: int
    params: ListenParams
    # the oldest frame the client still holds (its resend_from): nothing before it is asked for
    resend_from: int = 0

    @property
    def resume_frame(self) -> int:
        """The client's first frame to send, counted from the start of the stream."""
        rate = self.params.sample_rate
        grid = SAMPLE_RATE // math.gcd(rate, SAMPLE_RATE)
        accounted = min(c.accounted for c in self.record.channels)
        if self.params.container is not None:  # the client sends a new file from where it is: no context to resend
            return accounted // grid * grid * rate // SAMPLE_RATE
        held = -(-self.resend_from * SAMPLE_RATE // rate)  # the client's oldest frame, in stream samples (rounded up)
        wanted = max(min(c.replay_from for c in self.record.channels), held)
        sample = -(-wanted // grid) * grid  # up to the grid: the client holds it
        if sample > accounted:
            # the client no longer holds audio that no final covers: it resends from the accounted position, the
            # frames it lacks as silence, and reports them lost (streamer.reconnect)
            sample = accounted // grid * grid
        return sample * rate // SAMPLE_RATE

    @property
    def resume_sample(self) -> int:
        """:attr:`resume_frame` in 16 kHz stream samples (exact: the frame falls on a sample)."""
        return self.resume_frame * SAMPLE_RATE // self.params.sample_rate

    def origin(self, channel: int) -> StreamOrigin:
        """Where channel ``channel``'s new core starts: its record's accounting, the words committed before it (the
        model's context) and :meth:`replay_from`."""
        taken = self.record.channels[channel]
        context = tuple(
            w for f in self.record.finals if f.channel == channel for w in f.final.words if w.end <= taken.accounted
        )
        return StreamOrigin(taken.accounted, taken.next_segment_id, context, self.replay_from(channel))

    def skip(self, channel: int) -> int:
        """Resampled samples channel ``channel`` drops before its core: what the client resends from before its
        replay start. A container's client sends a new file from where it is, not the old one's audio again."""
        if self.params.container is not None:
            return 0
        return self.replay_from(channel) - self.resume_sample

    def replay_from(self, channel: int) -> int:
        """Where channel ``channel``'s new core is fed audio from (:attr:`StreamOrigin.replay_from`): its record's
        context start, or later where the client resends from later; its accounted position for a container."""
        taken = self.record.channels[channel]
        if self.params.container is not None:
            return taken.accounted
        return max(self.resume_sample, taken.replay_from)


def open_listen_session(
    path: str,
    owner: Principal,
    scheduler: Scheduler,
    core_options: CoreOptions,
    options: SessionOptions,
    model: str,
    metrics: ServerMetrics,
    registry: ResumeRegistry,
    now: float,
    store: SessionStore | None = None,
    record: SessionRecord | None = None,
    speakers: SpeakerWorker | None = None,
) -> Session:
    """The adapter of a ``/v1/listen`` connection to ``path`` (with its query), opened by ``owner`` at ``now``: the
    parked session its query names, claimed back and resumed; or the session of ``record`` (another replica's, which
    the caller took over from ``store``: :meth:`~streamer.server.resume.SessionStore.take_over`), continued here; or
    else a new :class:`Session`, which may park in ``registry`` if its connection drops and keeps its record in
    ``store``. 1. What did the client ask for? A bad request, or a resume of a session this process does not keep for
    ``owner``, raises the :class:`~streamer.core.errors.ProtocolError` the runner refuses the connection with (an
    error, then its close code). Credentials, origin and the admission slot were the runner's
    (:mod:`streamer.server.routes`)."""
    try:
        takeover: Takeover | None = None
        if any(key == "resume" for key, _ in parse_qsl(urlsplit(path).query)):
            request = parse_resume_query(path)
            if request is None:
                raise UnknownSession("no resume parameter")
            if record is None:
                claimed = registry.claim(request.session_id, request.last_seq, owner)
                assert isinstance(claimed, Session)  # the registry holds only sessions
                claimed.resume(request.last_seq, now)
                return claimed
            params = parse_listen_query(f"{LISTEN_PATH}?{record.query}")
            resend_from = round(request.resend_from * params.sample_rate)
            takeover = Takeover(record, request.last_seq, params, resend_from)
        else:
            params = parse_listen_query(path)
        # a language the model cannot serve is refused here, not by the engine in a batch (issue 14, finding 2)
        decode = core_options.decode
        check_supported(scheduler.engine.info, params.language or decode.language, decode.task)
        if params.diarize and (speakers is None or not speakers.available):
            raise DiarizationUnavailable(DIARIZATION_UNAVAILABLE)
    except ProtocolError as refusal:
        logger.info("event=rejected code=%s reason=%r", refusal.code, refusal.message)
        raise
    session = Session(
        params, scheduler, core_options, options, model, now, metrics, registry, store, takeover, speakers
    )
    if takeover is None:
        session.owner = owner
    return session
