"""Protocol v1 of ``/v1/listen``, client to server: binary frames of audio in the format the query string named
(:mod:`streamer.server.listen_query`), and JSON text frames :class:`Finalize`, :class:`End`, :class:`KeepAlive` and
:class:`Configure`, each a typed dataclass.

Sans-I/O: the session (:mod:`streamer.server.session`) turns a text frame into its message with
:func:`parse_client_message`; the client (:mod:`streamer.client`) writes one with :func:`serialize_client_message`.
``docs/protocol.md`` describes each, with examples.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from streamer.core.errors import ConfigError, FrameTooLarge, MalformedMessage
from streamer.server.bounded_json import parse_json_object
from streamer.server.listen_query import check_prompt, check_speakers

__all__ = [
    "MAX_TEXT_FRAME_CHARS",
    "ClientMessage",
    "Configure",
    "End",
    "Finalize",
    "KeepAlive",
    "parse_client_message",
    "serialize_client_message",
]

# control messages are a few dozen characters, a configure at most about 6000 (the longest prompt and 100 of the
# longest keywords, as UTF-8): anything much longer is refused before it is parsed
MAX_TEXT_FRAME_CHARS = 16384


@dataclass(frozen=True)
class Finalize:
    """Commit everything received so far as finals now, without waiting for a pause; the stream goes on."""


@dataclass(frozen=True)
class End:
    """No more audio: the server sends every final, then ``done``, then closes with 1000."""


@dataclass(frozen=True)
class KeepAlive:
    """Resets the idle timeout while the client has no audio to send."""


@dataclass(frozen=True)
class Configure:
    """Change the session's prompt and keywords: every window decoded from now on uses them (a window already being
    decoded keeps the old ones). A field left out of the message keeps its value."""

    prompt: str | None = None
    keywords: tuple[str, ...] | None = None
    # turn speaker labels on (or off) from the next event on; max_speakers bounds the count (1 to 32)
    diarize: bool | None = None
    max_speakers: int | None = None


ClientMessage = Finalize | End | KeepAlive | Configure

_CLIENT_TYPES: dict[str, ClientMessage] = {"finalize": Finalize(), "end": End(), "keepalive": KeepAlive()}
_CONFIGURE_FIELDS = ("prompt", "keywords", "diarize", "max_speakers")


def _parse_configure(data: dict[str, Any]) -> Configure:
    extra = sorted(set(data) - {"type", *_CONFIGURE_FIELDS})
    if extra:
        raise MalformedMessage(f"unexpected fields in 'configure' message: {', '.join(extra)}")
    prompt = data.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise MalformedMessage("configure: prompt must be a string")
    keywords = data.get("keywords")
    if keywords is not None and not (isinstance(keywords, list) and all(isinstance(k, str) for k in keywords)):
        raise MalformedMessage("configure: keywords must be a list of strings")
    diarize = data.get("diarize")
    if diarize is not None and not isinstance(diarize, bool):
        raise MalformedMessage("configure: diarize must be true or false")
    max_speakers = data.get("max_speakers")
    if max_speakers is not None and (isinstance(max_speakers, bool) or not isinstance(max_speakers, int)):
        raise MalformedMessage("configure: max_speakers must be an integer")
    message = Configure(
        prompt=None if prompt is None else prompt.strip(),
        keywords=None if keywords is None else tuple(k.strip() for k in keywords if k.strip()),
        diarize=diarize,
        max_speakers=max_speakers,
    )
    try:
        check_prompt(message.prompt or "", message.keywords or ())
        if max_speakers is not None:
            check_speakers(True, max_speakers)
    except ConfigError as error:
        raise MalformedMessage(f"configure: {error}") from None
    return message


def parse_client_message(text: str) -> ClientMessage:
    """Parse one text frame from a client; raise :class:`~streamer.core.errors.MalformedMessage` (close 4400) saying
    what is wrong with it, or :class:`~streamer.core.errors.FrameTooLarge` (close 1009) for a frame over
    :data:`MAX_TEXT_FRAME_CHARS`, checked before any parsing."""
    if len(text) > MAX_TEXT_FRAME_CHARS:
        raise FrameTooLarge(f"text frames may hold at most {MAX_TEXT_FRAME_CHARS} characters, this one {len(text)}")
    data = parse_json_object(text)
    kind = data.get("type")
    if not isinstance(kind, str):
        raise MalformedMessage('a text frame needs a string "type" field')
    if kind == "configure":
        return _parse_configure(data)
    message = _CLIENT_TYPES.get(kind)
    if message is None:
        allowed = ", ".join(repr(k) for k in (*_CLIENT_TYPES, "configure"))
        raise MalformedMessage(f"unknown message type {kind!r}; expected one of {allowed}")
    extra = sorted(set(data) - {"type"})
    if extra:
        raise MalformedMessage(f"unexpected fields in {kind!r} message: {', '.join(extra)}")
    return message


def serialize_client_message(message: ClientMessage) -> str:
    """The text frame a client sends for ``message``."""
    if isinstance(message, Configure):
        data: dict[str, Any] = {"type": "configure"}
        if message.prompt is not None:
            data["prompt"] = message.prompt
        if message.keywords is not None:
            data["keywords"] = list(message.keywords)
        if message.diarize is not None:
            data["diarize"] = message.diarize
        if message.max_speakers is not None:
            data["max_speakers"] = message.max_speakers
        return json.dumps(data, ensure_ascii=False)
    kind = next(k for k, v in _CLIENT_TYPES.items() if v == message)
    return json.dumps({"type": kind})
