from __future__ import annotations

import math
from typing import Any

import pytest

from streamer.core.events import Word
from streamer.integrations.realtime import InvalidRequest
from streamer.integrations.realtime_items import EventIds, Items

MS = 16


def items(server_vad: bool, beta: bool = False, logprobs: bool = False) -> Items:
    return Items(server_vad, beta, EventIds(), logprobs)


def words(text: str, start_ms: int, probability: float = 0.9) -> tuple[Word, ...]:
    return tuple(
        Word(w, (start_ms + 300 * i) * MS, (start_ms + 300 * i + 250) * MS, probability)
        for i, w in enumerate(text.split())
    )


def final(its: Items, start_ms: int, end_ms: int, text: str) -> list[dict[str, Any]]:
    return its.final(start_ms * MS, end_ms * MS, text, words(text, start_ms))


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["type"]) for e in events]


DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"


def test_server_vad_deltas_go_out_as_finals_come_before_the_turn_ends() -> None:
    its = items(server_vad=True)
    started = its.speech_started(100 * MS)
    assert kinds(started) == ["input_audio_buffer.speech_started"] and started[0]["audio_start_ms"] == 100
    item_id = started[0]["item_id"]
    # the turn is still open: the final goes out at once as a delta of the announced item
    first = final(its, 100, 900, " hello there")
    assert kinds(first) == [DELTA] and first[0]["item_id"] == item_id and first[0]["delta"] == "hello there"
    assert its.settle(100 * MS) == []
    # the VAD's end point: speech_stopped with the end point (not the last word's end), committed, added
    ended = its.speech_ended(100 * MS, 1600 * MS, client_commit=False)
    assert kinds(ended) == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
    ]
    assert ended[0]["audio_end_ms"] == 1600 and ended[1]["previous_item_id"] is None
    assert ended[2]["item"]["id"] == item_id and ended[2]["item"]["role"] == "user"
    assert its.settle(100 * MS) == []  # its last final needs one more decode
    last = final(its, 900, 1500, " general")
    assert kinds(last) == [DELTA] and last[0]["delta"] == " general"
    done = its.settle(None)
    assert kinds(done) == [COMPLETED, "conversation.item.done"]
    assert done[0]["transcript"] == "hello there general" and done[0]["usage"] == {"type": "duration", "seconds": 1.5}
    assert done[1]["item"]["content"][0]["transcript"] == "hello there general"
    assert "logprobs" not in done[0]
    # the next turn points back at this one
    second = its.speech_started(3000 * MS)[0]["item_id"]
    final(its, 3000, 3500, "bye")
    committed = its.speech_ended(3000 * MS, 3600 * MS, client_commit=False)[1]
    assert committed["item_id"] == second and committed["previous_item_id"] == item_id
    assert kinds(its.settle(5000 * MS)) == [COMPLETED, "conversation.item.done"]  # a third utterance is under way


def test_beta_clients_get_item_created_and_no_item_done() -> None:
    its = items(server_vad=True, beta=True)
    its.speech_started(0)
    ended = its.speech_ended(0, 500 * MS, client_commit=False)
    assert kinds(ended)[-1] == "conversation.item.created"
    final(its, 0, 500, "hi")
    assert kinds(its.settle(None)) == [COMPLETED]


def test_a_client_commit_under_server_vad_sends_no_speech_stopped() -> None:
    its = items(server_vad=True)
    its.speech_started(0)
    assert its.commit(800 * MS) == []  # the session finalizes the core next, which ends the utterance
    ended = its.speech_ended(0, 800 * MS, client_commit=True)
    assert kinds(ended) == ["input_audio_buffer.committed", "conversation.item.added"]


def test_manual_commit_streams_deltas_before_the_commit_and_completes_when_the_core_catches_up() -> None:
    its = items(server_vad=False)
    assert its.speech_started(0) == [] and its.speech_ended(0, 800 * MS, client_commit=False) == []
    first = final(its, 0, 800, "one two")
    assert kinds(first) == [DELTA]  # before any commit
    item_id = first[0]["item_id"]
    events = its.commit(1000 * MS)
    assert kinds(events) == ["input_audio_buffer.committed", "conversation.item.added"]
    assert events[0]["item_id"] == item_id
    assert its.settle(500 * MS) == []  # an utterance that began before the commit is still open
    assert kinds(final(its, 800, 1000, "three")) == [DELTA]
    done = its.settle(None)
    assert kinds(done) == [COMPLETED, "conversation.item.done"] and done[0]["transcript"] == "one two three"
    assert done[0]["item_id"] == item_id
    # audio after the commit belongs to the next item
    nxt = final(its, 1200, 1500, "four")[0]["item_id"]
    assert nxt != item_id
    committed = its.commit(2000 * MS)[0]
    assert committed["item_id"] == nxt and committed["previous_item_id"] == item_id
    assert its.settle(None)[0]["transcript"] == "four"


def test_commit_needs_100_ms_of_new_audio() -> None:
    its = items(server_vad=False)
    with pytest.raises(InvalidRequest) as raised:
        its.commit(50 * MS)
    assert raised.value.code == "input_audio_buffer_commit_empty"


def test_clear_drops_the_uncommitted_text() -> None:
    its = items(server_vad=False)
    final(its, 0, 400, "forget")
    assert kinds(its.clear(600 * MS)) == ["input_audio_buffer.cleared"]
    assert final(its, 400, 500, "me") == []  # the cleared audio's last final is dropped
    assert its.settle(None) == []
    final(its, 700, 900, "keep me")
    its.commit(1000 * MS)
    assert its.settle(None)[0]["transcript"] == "keep me"


def test_end_commits_and_completes_open_items() -> None:
    its = items(server_vad=False)
    final(its, 0, 500, "cut short")
    assert kinds(its.end()) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        COMPLETED,
        "conversation.item.done",
    ]


def test_lost_audio_fails_its_item_with_the_error_and_the_item_still_ends() -> None:
    its = items(server_vad=True)
    item_id = its.speech_started(0)[0]["item_id"]
    final(its, 0, 600, "before")
    failed = its.lost(600 * MS, 1600 * MS, "the engine failed to decode this window")
    assert kinds(failed) == [FAILED] and failed[0]["item_id"] == item_id and failed[0]["content_index"] == 0
    error = failed[0]["error"]
    assert error["code"] == "engine_failure"
    assert error["message"] == "the engine failed to decode this window: 0.60-1.60 s of audio is lost"
    assert its.lost(1600 * MS, 2000 * MS, "again") == []  # once per item
    its.speech_ended(0, 2000 * MS, client_commit=False)
    done = its.settle(None)
    assert kinds(done) == ["conversation.item.done"]  # failed, not completed
    assert done[0]["item"]["content"][0]["transcript"] == "before"


def test_a_lost_tail_fails_every_item_that_starts_inside_it() -> None:
    # a flush that gave up: the rest of the stream, over several utterances the VAD had found, is one Lost span
    its = items(server_vad=True)
    first = its.speech_started(0)[0]["item_id"]
    final(its, 0, 600, "kept")
    its.speech_ended(0, 1000 * MS, client_commit=False)
    second = its.speech_started(2000 * MS)[0]["item_id"]
    its.speech_ended(2000 * MS, 3000 * MS, client_commit=False)
    third = its.speech_started(4000 * MS)[0]["item_id"]
    failed = its.lost(600 * MS, 5000 * MS, "the engine did not finish this audio in time")
    assert kinds(failed) == [FAILED] * 3 and [f["item_id"] for f in failed] == [first, second, third]
    ended = its.end()
    assert FAILED not in kinds(ended) and COMPLETED not in kinds(ended)  # each ends once, failed, not completed
    transcripts = [e["item"]["content"][0]["transcript"] for e in ended if e["type"] == "conversation.item.done"]
    assert transcripts == ["kept", "", ""]


def test_timeout_commits_the_quiet_as_an_empty_item() -> None:
    its = items(server_vad=True)
    events = its.timeout(1000 * MS, 6000 * MS)
    assert kinds(events) == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        COMPLETED,
        "conversation.item.done",
    ]
    assert events[0]["audio_start_ms"] == 1000 and events[0]["audio_end_ms"] == 6000
    assert {e.get("item_id", e.get("item", {}).get("id")) for e in events} == {events[0]["item_id"]}
    assert events[3]["transcript"] == ""


def test_logprobs_are_the_words_probabilities_when_included() -> None:
    its = items(server_vad=True, logprobs=True)
    its.speech_started(0)
    first = its.final(0, 600 * MS, "hello world", words("hello world", 0, 0.5))[0]
    assert [p["token"] for p in first["logprobs"]] == ["hello", " world"]
    assert first["logprobs"][0]["logprob"] == pytest.approx(math.log(0.5), abs=1e-6)
    assert first["logprobs"][1]["bytes"] == list(b" world")
    second = its.final(600 * MS, 900 * MS, "again", words("again", 600, 1.0))[0]
    assert second["logprobs"] == [{"token": " again", "logprob": 0.0, "bytes": list(b" again")}]
    its.speech_ended(0, 900 * MS, client_commit=False)
    completed = its.settle(None)[0]
    assert "".join(p["token"] for p in completed["logprobs"]) == completed["transcript"] == "hello world again"
