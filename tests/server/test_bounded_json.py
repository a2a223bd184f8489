from __future__ import annotations

import json
import tracemalloc

import pytest

from streamer.core.errors import MalformedMessage
from streamer.server.bounded_json import MAX_JSON_DEPTH, json_depth, parse_json_object

# --- issue 14: JSON nested past the parser's recursion limit ---------------------------------------------------


def nested(depth: int) -> str:
    """An object whose one field holds arrays nested to ``depth`` in all."""
    return '{"type": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize("brackets", [1000, 100_000])
def test_deeply_nested_json_is_a_bad_message_not_a_recursion_error(brackets: int) -> None:
    # 1000 '[' in one frame raised RecursionError: close 1011 and a traceback in the log
    for text in ("[" * brackets, '{"type": ' + "[" * brackets, nested(brackets)):
        with pytest.raises(MalformedMessage) as info:
            parse_json_object(text)
        assert info.value.code == "bad_message" and info.value.close_code == 4400
    with pytest.raises(MalformedMessage, match="not list"):
        parse_json_object("[" * brackets)
    with pytest.raises(MalformedMessage, match=f"{MAX_JSON_DEPTH} deep, this one {brackets}"):
        parse_json_object(nested(brackets))


def test_nesting_up_to_the_limit_parses_and_brackets_in_strings_do_not_count() -> None:
    value, levels = parse_json_object(nested(MAX_JSON_DEPTH))["type"], 1
    while isinstance(value, list):
        value, levels = value[0] if value else None, levels + 1
    assert levels == MAX_JSON_DEPTH
    assert json_depth(nested(MAX_JSON_DEPTH)) == MAX_JSON_DEPTH
    with pytest.raises(MalformedMessage, match="deep"):
        parse_json_object(nested(MAX_JSON_DEPTH + 1))
    quoted = json.dumps({"type": "[" * 10_000 + '\\"{' * 100, "x": [{"y": "]]]"}]})
    assert json_depth(quoted) == 3
    assert parse_json_object(quoted)["x"] == [{"y": "]]]"}]


@pytest.mark.parametrize(
    ("text", "depth"),
    [("{}", 1), ("3", 0), ('"[[["', 0), ('"unterminated [[[', 0), ("[[]]]][[", 2), ("[[" + '"\\' * 5, 2), ("", 0)],
)
def test_depth_is_counted_outside_strings_even_in_text_that_is_not_json(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_depth_is_counted_in_memory_linear_in_the_text() -> None:
    # not wall-clock: what the count allocates, for a frame as long as a Realtime event may be
    text = '{"a": ' + "[" * 1_400_000
    tracemalloc.start()
    try:
        assert json_depth(text) == 1_400_001
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 2 * len(text) + 2**20  # the text without its strings, as str and bytes, and one block of levels
