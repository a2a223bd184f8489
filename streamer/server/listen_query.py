"""The query string of ``/v1/listen``'s opening handshake (protocol v1, ``docs/protocol.md``): the audio the client
will send and the session's prompt (:class:`ListenParams`, built by :func:`parse_listen_query`), and a request to
resume an earlier session (:class:`ResumeRequest`, built by :func:`parse_resume_query`).

Sans-I/O: the session (:mod:`streamer.server.session`) parses the request target it was handed; the client
(:mod:`streamer.client`) writes one with :meth:`ListenParams.to_query`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from urllib.parse import parse_qsl, urlencode, urlsplit

from streamer.core.audio import AudioFormat, Encoding
from streamer.core.container import ContainerEncoding
from streamer.core.errors import ConfigError, UnsupportedAudio
from streamer.core.speakers import SpeakerOptions
from streamer.engine.types import DecodeOptions

__all__ = [
    "LISTEN_PATH",
    "ListenParams",
    "ResumeRequest",
    "check_prompt",
    "check_speakers",
    "parse_bool",
    "parse_listen_query",
    "parse_resume_query",
    "split_keywords",
]

LISTEN_PATH = "/v1/listen"


@dataclass(frozen=True)
class ListenParams:
    """What the client declared in the query string of ``/v1/listen``. Build with :func:`parse_listen_query`."""

    # rate of the audio the client sends, in Hz; the server resamples to 16 kHz. Ignored for a container
    sample_rate: int = 16000
    # how each sample is encoded in the binary frames, or a container (WebM, Ogg, WAV) that says it itself
    encoding: Encoding | ContainerEncoding = Encoding.PCM_S16LE
    # 1, or 2 for interleaved stereo with one transcript per channel (a container: mixed down to mono for 1; for 2
    # it must be stereo)
    channels: int = 1
    # ISO 639-1 code; None lets a multilingual model detect it
    language: str | None = None
    # the session's prompt: text every window is conditioned on (a domain, names, a spelling style)
    prompt: str = ""
    # words and names whose spelling decoding favours (``keywords=a,b``, or the parameter repeated)
    keywords: tuple[str, ...] = ()
    # label who speaks (``diarize=true``): a speaker on every final, partial and word (streamer.core.diarization)
    diarize: bool = False
    # the most speakers a channel may have when diarizing (1 to MAX_SPEAKERS); None: MAX_SPEAKERS
    max_speakers: int | None = None

    @property
    def container(self) -> ContainerEncoding | None:
        """The container the client declared, or None for raw samples."""
        return self.encoding if isinstance(self.encoding, ContainerEncoding) else None

    @property
    def audio_format(self) -> AudioFormat:
        """The raw samples' format (a container's comes from the container: use :attr:`container` first)."""
        encoding = Encoding.PCM_S16LE if isinstance(self.encoding, ContainerEncoding) else self.encoding
        return AudioFormat(encoding=encoding, sample_rate=self.sample_rate, channels=self.channels)

    def validate(self) -> None:
        """Raise :class:`~streamer.core.errors.UnsupportedAudio` naming the first value the server cannot accept."""
        if self.container is None:
            self.audio_format.validate()
        elif self.channels not in (1, 2):
            raise UnsupportedAudio(f"channels {self.channels!r} is not supported; use 1 or 2")
        if self.language is not None and not (2 <= len(self.language) <= 3 and self.language.isalpha()):
            raise UnsupportedAudio(f"language must be an ISO 639-1 code such as 'en', not {self.language!r}")
        try:
            check_prompt(self.prompt, self.keywords)
            check_speakers(self.diarize, self.max_speakers)
        except ConfigError as error:
            raise UnsupportedAudio(str(error)) from None

    def to_query(self) -> str:
        """The query string a client sends, without the leading ``?``."""
        pairs: list[tuple[str, str]] = [
            ("sample_rate", str(self.sample_rate)),
            ("encoding", self.encoding.value),
            ("channels", str(self.channels)),
        ]
        if self.language is not None:
            pairs.append(("language", self.language))
        if self.prompt:
            pairs.append(("prompt", self.prompt))
        # one parameter per keyword (a comma inside a value separates keywords too, so keywords hold none)
        pairs.extend(("keywords", keyword) for keyword in self.keywords)
        if self.diarize:
            pairs.append(("diarize", "true"))
        if self.max_speakers is not None:
            pairs.append(("max_speakers", str(self.max_speakers)))
        return urlencode(pairs)


def check_prompt(prompt: str, keywords: Sequence[str]) -> None:
    """Raise :class:`~streamer.core.errors.ConfigError` naming what is wrong with a session's prompt or keywords:
    the bounds are :class:`~streamer.engine.types.DecodeOptions`', checked there. The caller re-raises it as its
    protocol's error (``unsupported_audio`` for the query, ``bad_message`` for ``configure``)."""
    replace(DecodeOptions(), initial_prompt=prompt, keywords=tuple(keywords)).validate()


def check_speakers(diarize: bool, max_speakers: int | None) -> None:
    """Raise :class:`~streamer.core.errors.ConfigError` when ``max_speakers`` is out of bounds, or given without
    diarization (it would bound nothing)."""
    if max_speakers is None:
        return
    if not diarize:
        raise ConfigError("max_speakers needs diarize=true")
    replace(SpeakerOptions(), max_speakers=max_speakers).validate()


def parse_bool(name: str, value: str) -> bool:
    """``true`` or ``false`` (any case), else :class:`~streamer.core.errors.UnsupportedAudio` naming ``name``."""
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise UnsupportedAudio(f"{name} must be true or false, not {value!r}")
    return lowered == "true"


def split_keywords(values: Sequence[str]) -> tuple[str, ...]:
    """Keywords from query values, each a keyword or a comma-separated list of them: stripped, empties dropped."""
    return tuple(k.strip() for value in values for k in value.split(",") if k.strip())


_QUERY_KEYS = ("sample_rate", "encoding", "channels", "language", "prompt", "keywords", "diarize", "max_speakers")
# the query parameters that may be given more than once
_REPEATABLE_QUERY_KEYS = ("keywords",)
# query parameters of the handshake that are not about audio: consumed by the authenticator (streamer.server.auth) and
# by parse_resume_query
_IGNORED_QUERY_KEYS = ("token", "resume", "last_seq", "resend_from")


def _int_param(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise UnsupportedAudio(f"{name} must be an integer, not {value!r}") from None


def parse_listen_query(path: str) -> ListenParams:
    """Parse the request target of the opening handshake (``/v1/listen?sample_rate=...``).

    Call once the path is known to be :data:`LISTEN_PATH`. Raises :class:`~streamer.core.errors.UnsupportedAudio`
    (close 4415) for a missing-or-bad value or an unknown parameter; the caller sends the ``error`` message and
    closes. Omitted parameters take the defaults of :class:`ListenParams`.
    """
    pairs = parse_qsl(urlsplit(path).query, keep_blank_values=True)
    values: dict[str, str] = {}
    keywords: list[str] = []
    for key, value in pairs:
        if key in _IGNORED_QUERY_KEYS:
            continue
        if key not in _QUERY_KEYS:
            raise UnsupportedAudio(f"unknown query parameter {key!r}; expected one of {', '.join(_QUERY_KEYS)}")
        if key == "keywords":
            keywords.append(value)
            continue
        if key in values:
            raise UnsupportedAudio(f"query parameter {key!r} is given twice")
        values[key] = value
    defaults = ListenParams()
    name = values.get("encoding", defaults.encoding.value)
    encodings: tuple[Encoding | ContainerEncoding, ...] = (*Encoding, *ContainerEncoding)
    encoding = next((e for e in encodings if e.value == name), None)
    if encoding is None:
        allowed = ", ".join(e.value for e in encodings)
        raise UnsupportedAudio(f"encoding must be one of {allowed}, not {name!r}")
    params = ListenParams(
        sample_rate=_int_param("sample_rate", values["sample_rate"]) if "sample_rate" in values else 16000,
        encoding=encoding,
        channels=_int_param("channels", values["channels"]) if "channels" in values else 1,
        language=values.get("language") or None,
        prompt=values.get("prompt", "").strip(),
        keywords=split_keywords(keywords),
        diarize=parse_bool("diarize", values["diarize"]) if "diarize" in values else False,
        max_speakers=_int_param("max_speakers", values["max_speakers"]) if "max_speakers" in values else None,
    )
    params.validate()
    return params


@dataclass(frozen=True)
class ResumeRequest:
    """``?resume=<session_id>&last_seq=<n>``: continue a session whose connection dropped. Build with
    :func:`parse_resume_query`."""

    # the session_id of the first connection's `ready`
    session_id: str
    # the seq of the last final the client received (0: none); the server replays every final after it
    last_seq: int
    # seconds of the stream (per channel) where the oldest audio the client still holds begins: a replica taking the
    # session over asks for nothing before it (docs/protocol.md, Resume). 0: it holds everything it sent
    resend_from: float = 0.0


def parse_resume_query(path: str) -> ResumeRequest | None:
    """The resume request in a handshake's target, or None when it has no ``resume`` parameter. Raises
    :class:`~streamer.core.errors.UnsupportedAudio` (close 4415, like any bad query parameter) when ``resume`` is not a
    session id or ``last_seq`` is not a non-negative integer. The audio parameters of a resume are the first
    connection's; any given again are ignored."""
    values = dict(parse_qsl(urlsplit(path).query, keep_blank_values=True))
    if "resume" not in values:
        return None
    session_id = values["resume"]
    if not (1 <= len(session_id) <= 64 and session_id.isascii() and session_id.isalnum()):
        raise UnsupportedAudio("resume must be the session_id of an earlier ready message")
    last_seq = values.get("last_seq", "0")
    if not (last_seq.isascii() and last_seq.isdigit() and len(last_seq) <= 12):
        raise UnsupportedAudio(f"last_seq must be a non-negative integer, not {last_seq!r}")
    resend_from = values.get("resend_from", "0")
    whole, dot, fraction = resend_from.partition(".")
    if not (resend_from.isascii() and whole.isdigit() and len(whole) <= 9 and (not dot or fraction.isdigit())):
        raise UnsupportedAudio(f"resend_from must be a non-negative number of seconds, not {resend_from!r}")
    return ResumeRequest(session_id=session_id, last_seq=int(last_seq), resend_from=float(resend_from))
