"""JSON from clients, parsed within bounds, on every endpoint (``/v1/listen``, ``/twilio``, ``/v1/realtime``, and
the native client reading a server): :func:`parse_json_object` refuses a text frame that is not one JSON object, or
that nests deeper than :data:`MAX_JSON_DEPTH`, before the parser sees it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from streamer.core.errors import MalformedMessage

__all__ = ["MAX_JSON_DEPTH", "json_depth", "parse_json_object"]

# Nesting of arrays and objects a client message may have ({} is 1). The deepest message any endpoint takes is a
# Realtime session.update, 5 ({session: {audio: {input: {format: {...}}}}}); 16 leaves room for fields we ignore
# while keeping the parser, which recurses once per level, far from Python's recursion limit (issue 14: a frame of
# 1000 '[' raised RecursionError, close 1011 and a traceback).
MAX_JSON_DEPTH = 16

_JSON_WHITESPACE = re.compile(r"[ \t\n\r]*")  # RFC 8259 section 2
# A string (RFC 8259 section 7), or an unterminated one up to the end. Possessive, and matching at every '"', so
# the substitution below is one pass without backtracking; brackets inside strings are not nesting.
_JSON_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?\Z)', re.DOTALL)
_NESTING_STEP = np.zeros(256, dtype=np.int8)  # per byte outside strings: +1 opens a level, -1 closes one
_NESTING_STEP[[ord("["), ord("{")]] = 1
_NESTING_STEP[[ord("]"), ord("}")]] = -1
_DEPTH_BLOCK = 1 << 16  # bytes counted at a time: the running levels take 512 KiB whatever the text's length
_KIND_BY_FIRST_CHAR = {"[": "list", '"': "str", "t": "bool", "f": "bool", "n": "null"} | dict.fromkeys(
    "-0123456789", "number"
)


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (0 for a scalar), found without parsing it: brackets
    are counted outside strings in one linear pass, in about 2 bytes per character plus a fixed block. For text
    that is not JSON the count is at least as deep as any a JSON parser would reach before it fails."""
    skeleton = _JSON_STRING.sub("", text).encode("utf-8", "surrogatepass")
    level = deepest = 0
    for start in range(0, len(skeleton), _DEPTH_BLOCK):
        codes = np.frombuffer(skeleton, dtype=np.uint8, count=min(_DEPTH_BLOCK, len(skeleton) - start), offset=start)
        levels = np.cumsum(_NESTING_STEP[codes], dtype=np.int64) + level
        deepest = max(deepest, int(levels.max()))
        level = int(levels[-1])
    return deepest


def parse_json_object(text: str, what: str = "text frames") -> dict[str, Any]:
    """Parse a client's text frame, which must hold one JSON object; ``what`` names the frames in error messages.

    Raises :class:`~streamer.core.errors.MalformedMessage` (``bad_message``, close 4400) for text that is not JSON, a
    top level other than an object, or nesting deeper than :data:`MAX_JSON_DEPTH`. The last two are checked before
    parsing, in time and memory linear in the text, so that no frame makes the parser recurse past that depth. The
    caller checks the frame's length first."""
    leading = _JSON_WHITESPACE.match(text)
    at = leading.end() if leading else 0
    first = text[at : at + 1]
    if first != "{":
        kind = _KIND_BY_FIRST_CHAR.get(first)
        if kind is None:
            raise MalformedMessage(f"{what} must be JSON objects: not JSON")
        raise MalformedMessage(f"{what} must be JSON objects, not {kind}")
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise MalformedMessage(f"{what} may nest arrays and objects {MAX_JSON_DEPTH} deep, this one {depth}")
    try:
        # text that starts with '{' parses to an object or not at all ("Extra data" after one)
        data: dict[str, Any] = json.loads(text)
    except json.JSONDecodeError as error:
        raise MalformedMessage(f"{what} must be JSON objects: {error.msg} at position {error.pos}") from None
    except ValueError:  # a number of more digits than Python converts (sys.get_int_max_str_digits)
        raise MalformedMessage(f"{what} must be JSON objects: a number is too long") from None
    return data
