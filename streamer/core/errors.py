"""One exception hierarchy for the whole server.

Every error that can reach a client maps to exactly one wire ``code`` (the ``code`` field of an ``error`` message)
and one WebSocket close code. Internal failures never leak their text to clients: they become
:class:`InternalError`, whose message is generic.

::

    StreamerError
    ├── ConfigError                  bad option or command-line value        (cli exit 2)
    ├── ModelError                   model cannot be found or loaded         (cli exit 3)
    │   ├── UnknownModelError
    │   └── ModelFilesError
    ├── AudioFileError               offline input file unusable             (cli exit 4)
    ├── InvalidState                 a call in the wrong state (a bug in the caller)
    ├── SessionLost                  a client could not carry its session over a dropped connection
    └── ProtocolError                anything a client can get wrong or suffer; has .code and .close_code
        ├── MalformedMessage         bad_message          4400
        ├── BadContainer             bad_container        4400
        ├── MediaGapTooLong          media_gap_too_long   4400
        ├── UnsupportedAudio         unsupported_audio    4415
        ├── FrameTooLarge            frame_too_large      1009
        ├── Unauthorized             unauthorized         4401
        ├── IdleTimeout              idle_timeout         4408
        ├── SessionTooLong           session_too_long     4408
        ├── RateLimited              rate_limited         4429
        ├── TrackInUse               track_in_use         4409
        ├── UnknownSession           unknown_session      4404
        ├── AtCapacity               at_capacity          1013
        ├── ServerShutdown           shutting_down        1001
        ├── SlowReader               slow_reader          4408
        ├── EngineFailure            engine_failure       1011
        ├── DiarizationUnavailable   diarization_unavailable  4415
        ├── DiarizationFailure       diarization_failed   (a notice: the session goes on)
        └── InternalError            internal_error       1011
"""

from __future__ import annotations

__all__ = [
    "AtCapacity",
    "AudioFileError",
    "BadContainer",
    "ConfigError",
    "DiarizationFailure",
    "DiarizationUnavailable",
    "EngineFailure",
    "FrameTooLarge",
    "IdleTimeout",
    "InternalError",
    "InvalidState",
    "MalformedMessage",
    "MediaGapTooLong",
    "ModelError",
    "ModelFilesError",
    "ProtocolError",
    "RateLimited",
    "ServerShutdown",
    "SessionLost",
    "SessionTooLong",
    "SlowReader",
    "StreamerError",
    "TrackInUse",
    "Unauthorized",
    "UnknownModelError",
    "UnknownSession",
    "UnsupportedAudio",
]


class StreamerError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(StreamerError):
    """An option or command-line value is invalid; the message says which and what is allowed."""


class ModelError(StreamerError):
    """A model cannot be resolved or loaded."""


class UnknownModelError(ModelError):
    """The model name is neither a known name, a directory, nor an available Hugging Face id."""


class ModelFilesError(ModelError):
    """A model directory lacks files or holds files that cannot be read."""


class AudioFileError(StreamerError):
    """An audio file is missing, empty, corrupt or in a format that cannot be decoded."""


class InvalidState(StreamerError):
    """A method was called in a state that does not allow it (a bug in the caller, never the client's fault)."""


class SessionLost(StreamerError):
    """A client (:mod:`streamer.client`) gave up on its session: the server refused it for good (``code``, its wire
    code, or None), or reconnecting failed within the bounds of its back-off. Never sent on the wire."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class ProtocolError(StreamerError):
    """An error reported to a client: an ``error`` message with :attr:`code`, then a close with :attr:`close_code`."""

    code: str = "internal_error"
    close_code: int = 1011

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MalformedMessage(ProtocolError):
    code = "bad_message"
    close_code = 4400


class BadContainer(ProtocolError):
    """Containerised audio (WebM, Ogg, WAV; :mod:`streamer.core.container`) that cannot be decoded: not a container
    the server knows, a corrupt element, page or packet, or a stream cut short inside one. The audio decoded before
    the fault is kept and transcribed; the error names where decoding stopped."""

    code = "bad_container"
    close_code = 4400


class MediaGapTooLong(ProtocolError):
    """A Twilio media message starts further past the track's audio so far than lost media can explain
    (:data:`streamer.integrations.twilio.MAX_GAP_MS`): the silence it asks for is refused, not allocated."""

    code = "media_gap_too_long"
    close_code = 4400


class UnsupportedAudio(ProtocolError):
    code = "unsupported_audio"
    close_code = 4415


class FrameTooLarge(ProtocolError):
    code = "frame_too_large"
    close_code = 1009


class Unauthorized(ProtocolError):
    code = "unauthorized"
    close_code = 4401


class IdleTimeout(ProtocolError):
    code = "idle_timeout"
    close_code = 4408


class SessionTooLong(ProtocolError):
    code = "session_too_long"
    close_code = 4408


class RateLimited(ProtocolError):
    code = "rate_limited"
    close_code = 4429


class TrackInUse(ProtocolError):
    """A Twilio Media Stream names a track its call is already streaming on another connection (the same track
    twice at once): the second stream is refused, the first goes on (:mod:`streamer.integrations.twilio_calls`)."""

    code = "track_in_use"
    close_code = 4409


class UnknownSession(ProtocolError):
    """A resume names a session this process does not keep (ended, expired, resumed, or another process's), or
    finals after ``last_seq`` that are no longer kept: the client starts a new session."""

    code = "unknown_session"
    close_code = 4404


class AtCapacity(ProtocolError):
    code = "at_capacity"
    close_code = 1013


class ServerShutdown(ProtocolError):
    code = "shutting_down"
    close_code = 1001


class SlowReader(ProtocolError):
    code = "slow_reader"
    close_code = 4408


class EngineFailure(ProtocolError):
    code = "engine_failure"
    close_code = 1011


class DiarizationUnavailable(ProtocolError):
    """Speaker labels were asked of a server that has no speaker model (or has diarization turned off)."""

    code = "diarization_unavailable"
    close_code = 4415


class DiarizationFailure(ProtocolError):
    """Speaker labelling failed mid-stream: the transcript goes on without speakers. Sent once, as a notice; the
    session is not closed for it."""

    code = "diarization_failed"
    close_code = 1011


class InternalError(ProtocolError):
    code = "internal_error"
    close_code = 1011
