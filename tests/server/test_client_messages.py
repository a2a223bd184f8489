from __future__ import annotations

import pytest

from streamer.core.errors import FrameTooLarge, MalformedMessage
from streamer.server.client_messages import (
    MAX_TEXT_FRAME_CHARS,
    Configure,
    End,
    Finalize,
    KeepAlive,
    parse_client_message,
    serialize_client_message,
)


class TestClientMessages:
    @pytest.mark.parametrize(
        ("text", "message"),
        [('{"type":"finalize"}', Finalize()), ('{"type": "end"}', End()), ('{"type":"keepalive"}', KeepAlive())],
    )
    def test_known_types(self, text: str, message: object) -> None:
        assert parse_client_message(text) == message

    @pytest.mark.parametrize(
        "message",
        [
            Finalize(),
            End(),
            KeepAlive(),
            Configure(prompt="A talk.", keywords=("Zoë", "kubectl")),
            Configure(keywords=()),
            Configure(prompt=""),
            Configure(),
        ],
    )
    def test_round_trip(self, message: Finalize | End | KeepAlive | Configure) -> None:
        assert parse_client_message(serialize_client_message(message)) == message

    def test_configure_keeps_what_it_leaves_out_and_trims(self) -> None:
        message = parse_client_message('{"type": "configure", "keywords": [" etcd ", "", "Istio"]}')
        assert message == Configure(prompt=None, keywords=("etcd", "Istio"))

    def test_the_largest_configure_fits_in_a_text_frame(self) -> None:
        text = serialize_client_message(Configure(prompt="é" * 800, keywords=tuple("ß" * 50 for _ in range(100))))
        assert len(text) <= MAX_TEXT_FRAME_CHARS
        assert parse_client_message(text) == Configure(prompt="é" * 800, keywords=tuple("ß" * 50 for _ in range(100)))

    @pytest.mark.parametrize(
        ("text", "complaint"),
        [
            ("not json", "must be JSON objects"),
            ("[1, 2]", "JSON objects, not list"),
            ('"end"', "JSON objects, not str"),
            ("{}", 'needs a string "type"'),
            ('{"type": 3}', 'needs a string "type"'),
            ('{"type": "flush"}', "unknown message type 'flush'"),
            ('{"type": "end", "now": true}', "unexpected fields in 'end' message: now"),
            ('{"type": "configure", "prompts": "x"}', "unexpected fields in 'configure' message: prompts"),
            ('{"type": "configure", "prompt": 3}', "prompt must be a string"),
            ('{"type": "configure", "keywords": "a,b"}', "keywords must be a list of strings"),
            ('{"type": "configure", "keywords": [1]}', "keywords must be a list of strings"),
            ('{"type": "configure", "keywords": ["' + "z" * 51 + '"]}', "at most 50 characters each"),
            ('{"type": "configure", "prompt": "' + "p" * 801 + '"}', "at most 800 characters"),
        ],
    )
    def test_malformed(self, text: str, complaint: str) -> None:
        with pytest.raises(MalformedMessage, match=complaint) as info:
            parse_client_message(text)
        assert info.value.close_code == 4400
        assert info.value.code == "bad_message"


def test_an_oversized_text_frame_is_refused_before_parsing() -> None:
    with pytest.raises(FrameTooLarge) as info:
        parse_client_message('{"type": "end"' + " " * MAX_TEXT_FRAME_CHARS + "}")
    assert info.value.close_code == 1009


def test_a_listen_text_frame_of_1000_brackets_is_a_bad_message() -> None:
    for text in ("[" * 1000, '{"type": ' + "[" * 1000):
        with pytest.raises(MalformedMessage):
            parse_client_message(text)
