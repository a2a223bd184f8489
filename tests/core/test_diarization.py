from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from streamer.core.diarization import ChannelDiarizer, EmbedRequest, final_speaker
from streamer.core.errors import InvalidState
from streamer.core.events import Event, Final, NonSpeech, Partial, Word
from streamer.core.speakers import SpeakerOptions
from tests.conftest import load_clip

RATE = 16000
CHUNK = RATE // 10


class Conversation:
    """Two readers of the committed clips, one after the other with a second of silence between: A (1089), B (121),
    A again. The stand-in encoder knows who speaks where, so the tests are about the diarizer's timing and order,
    not the voice encoder's accuracy (tests/bench/test_speakers.py holds that)."""

    def __init__(self) -> None:
        pause = np.zeros(RATE, dtype=np.float32)
        parts = [
            load_clip("1089-134686-0000.flac"),
            load_clip("121-127105-0000.flac"),
            load_clip("1089-134686-0001.flac"),
        ]
        self.turns: list[tuple[int, int, str]] = []
        position = 0
        audio = []
        for part, reader in zip(parts, ("A", "B", "A"), strict=True):
            self.turns.append((position, position + len(part), reader))
            audio += [part, pause]
            position += len(part) + len(pause)
        self.samples = np.concatenate(audio)

    def reader_at(self, sample: int) -> str:
        for start, end, reader in self.turns:
            if start <= sample < end + RATE // 2:
                return reader
        return self.turns[-1][2]

    def embed(self, requests: Sequence[EmbedRequest]) -> npt.NDArray[np.float32]:
        vectors = {"A": [1.0, 0.0, 0.0], "B": [0.0, 1.0, 0.0]}
        return np.array([vectors[self.reader_at((r.start + r.end) // 2)] for r in requests], dtype=np.float32)

    def final(self, segment: int) -> Final:
        start, end, _ = self.turns[segment]
        first, last = start + RATE // 5, end - RATE // 5
        edges = np.linspace(first, last, 11).astype(int)
        words = tuple(Word(f"w{i}", int(a), int(b), 0.9) for i, (a, b) in enumerate(itertools.pairwise(edges)))
        return Final(segment, " ".join(w.text for w in words), start, end, words, end)


@pytest.fixture(scope="module")
def conversation() -> Conversation:
    return Conversation()


def stream(
    conversation: Conversation, diarizer: ChannelDiarizer, offers: dict[int, list[Event]], embed: bool = True
) -> list[tuple[int, Event]]:
    """Feed the conversation in 100 ms chunks; after the chunk that reaches sample ``k`` of ``offers`` the core's
    events there are handed in; returns every event released, with the sample it was released at."""
    released: list[tuple[int, Event]] = []
    samples = conversation.samples
    for start in range(0, len(samples), CHUNK):
        diarizer.receive_audio(samples[start : start + CHUNK])
        position = min(len(samples), start + CHUNK)
        requests = diarizer.windows_to_embed()
        if embed and requests:
            diarizer.receive_embeddings(requests, conversation.embed(requests))
        for at in [k for k in offers if k <= position]:
            diarizer.receive_events(offers.pop(at))
        released += [(position, e) for e in diarizer.events_received()]
    diarizer.receive_end_of_stream()
    requests = diarizer.windows_to_embed()
    if embed and requests:
        diarizer.receive_embeddings(requests, conversation.embed(requests))
    for events in offers.values():
        diarizer.receive_events(events)
    released += [(len(samples), e) for e in diarizer.events_received()]
    return released


def end_point_offers(conversation: Conversation) -> dict[int, list[Event]]:
    """Each turn's final at its end point (500 ms after its audio)."""
    return {end + RATE // 2: [conversation.final(i)] for i, (_, end, _) in enumerate(conversation.turns)}


def test_finals_carry_each_reader_s_label_on_them_and_on_every_word(conversation: Conversation) -> None:
    released = stream(conversation, ChannelDiarizer(), end_point_offers(conversation))
    finals = [e for _, e in released if isinstance(e, Final)]
    assert [f.segment_id for f in finals] == [0, 1, 2]
    assert [f.speaker for f in finals] == [0, 1, 0]
    for f in finals:
        assert {w.speaker for w in f.words} == {f.speaker}


def test_a_final_without_words_takes_the_speaker_of_its_span(conversation: Conversation) -> None:
    """A filler-only final (the model wrote nothing for an "uh") still says who was speaking: the speaker of the
    windows over its span; it adds no talk time."""
    offers = end_point_offers(conversation)
    (start, end, _) = conversation.turns[1]
    offers[end + RATE // 2] = [Final(1, "", start, end, (), end)]  # B's turn, with its words lost
    diarizer = ChannelDiarizer()
    finals = [e for _, e in stream(conversation, diarizer, offers) if isinstance(e, Final)]
    assert [(f.segment_id, f.speaker) for f in finals] == [(0, 0), (1, 1), (2, 0)]
    assert [t.speaker for t in diarizer.talk_times()] == [0]


def test_a_final_waits_for_the_windows_up_to_its_last_word_and_no_longer(conversation: Conversation) -> None:
    diarizer = ChannelDiarizer()
    released = stream(conversation, diarizer, end_point_offers(conversation))
    for position, event in released:
        assert isinstance(event, Final)
        last = event.words[-1].end
        offered = conversation.turns[event.segment_id][1] + RATE // 2
        # labelled only once the diarizer had decided the audio through its last word
        assert position >= last
        # and then at once: within a step of the window grid and the VAD's decision (plus a chunk)
        assert position - offered <= diarizer.options.step_samples + RATE // 2


def test_events_keep_the_core_s_order_behind_a_waiting_final_and_partials_go_at_once(
    conversation: Conversation,
) -> None:
    start, _, _ = conversation.turns[1]
    words = conversation.final(1).words[:3]
    early = Partial(1, "early", start, words[-1].end, words, words[-1].end)
    first = conversation.final(0)
    gap = NonSpeech(conversation.turns[0][1], start)
    # alone, a few seconds into the new reader (whose first windows confirm a new speaker): out at once
    offers: dict[int, list[Event]] = {words[-1].end + 2 * RATE: [early]}
    # the final of turn 0 handed in the very chunk its audio ends: it must wait, and what follows waits behind it
    offers[conversation.turns[0][1]] = [first, gap]
    released = stream(conversation, ChannelDiarizer(), offers)
    kinds = [type(e).__name__ for _, e in released]
    assert kinds == ["Final", "NonSpeech", "Partial"]
    at = {type(e).__name__: p for p, e in released}
    assert at["Final"] > conversation.turns[0][1]  # it waited
    assert at["NonSpeech"] == at["Final"]  # and the event behind it went with it
    partial = next(e for _, e in released if isinstance(e, Partial))
    assert partial.speaker == 1 and all(w.speaker == 1 for w in partial.words)


def test_max_speakers_bounds_the_count(conversation: Conversation) -> None:
    diarizer = ChannelDiarizer(SpeakerOptions(max_speakers=1))
    released = stream(conversation, diarizer, end_point_offers(conversation))
    assert {e.speaker for _, e in released if isinstance(e, Final)} == {0}
    assert diarizer.tracker.speakers == 1


def test_talk_times_sum_each_speaker_s_words(conversation: Conversation) -> None:
    diarizer = ChannelDiarizer()
    released = stream(conversation, diarizer, end_point_offers(conversation))
    spoken: dict[int, int] = {}
    for _, event in released:
        assert isinstance(event, Final)
        for w in event.words:
            assert w.speaker is not None
            spoken[w.speaker] = spoken.get(w.speaker, 0) + w.end - w.start
    assert [(t.speaker, t.samples) for t in diarizer.talk_times()] == sorted(spoken.items())


def test_a_failed_encoder_lets_every_event_go_unlabelled_and_says_why(conversation: Conversation) -> None:
    diarizer = ChannelDiarizer()
    offers = end_point_offers(conversation)
    first_offer = min(offers)
    diarizer.receive_audio(conversation.samples[:first_offer])
    diarizer.receive_events(offers.pop(first_offer))
    assert diarizer.held == 1 and diarizer.events_received() == []  # no embedding came: it waits
    diarizer.receive_failure("the voice encoder failed (RuntimeError)")
    [final] = diarizer.events_received()
    assert isinstance(final, Final) and final.speaker is None and all(w.speaker is None for w in final.words)
    assert diarizer.failure == "the voice encoder failed (RuntimeError)"
    diarizer.receive_events([conversation.final(1)])  # from now on nothing waits
    [later] = diarizer.events_received()
    assert later.speaker is None and diarizer.windows_to_embed() == []


def test_the_end_of_the_stream_releases_what_waits_even_without_embeddings(conversation: Conversation) -> None:
    diarizer = ChannelDiarizer()
    released = stream(conversation, diarizer, end_point_offers(conversation), embed=False)
    assert released == [] and diarizer.held == 3 and diarizer.busy
    diarizer.receive_failure("the server is shutting down")
    assert [e.segment_id for e in diarizer.events_received() if isinstance(e, Final)] == [0, 1, 2]


def test_stop_hands_back_what_waits_labelled_with_what_is_known(conversation: Conversation) -> None:
    diarizer = ChannelDiarizer()
    turn_end = conversation.turns[0][1]
    for start in range(0, turn_end, CHUNK):
        diarizer.receive_audio(conversation.samples[start : min(turn_end, start + CHUNK)])
        requests = diarizer.windows_to_embed()
        diarizer.receive_embeddings(requests, conversation.embed(requests))
    late = diarizer.windows_to_embed()
    diarizer.receive_events([conversation.final(0)])
    [final] = diarizer.stop()
    assert isinstance(final, Final) and final.speaker == 0
    diarizer.receive_embeddings(late, conversation.embed(late))  # arriving after the stop: nobody waits for it


def test_embeddings_must_come_back_in_the_order_taken(conversation: Conversation) -> None:
    diarizer = ChannelDiarizer()
    diarizer.receive_audio(conversation.samples[: 6 * RATE])
    requests = diarizer.windows_to_embed()
    assert len(requests) >= 2
    with pytest.raises(InvalidState):
        diarizer.receive_embeddings(requests[1:2], conversation.embed(requests[1:2]))


def test_a_long_stream_keeps_a_bounded_buffer_and_label_list(conversation: Conversation) -> None:
    diarizer = ChannelDiarizer()
    segment = 0
    for _ in range(6):  # about 2 minutes of the conversation, over and over, with a final per turn
        for start in range(0, len(conversation.samples), CHUNK):
            diarizer.receive_audio(conversation.samples[start : start + CHUNK])
            requests = diarizer.windows_to_embed()
            if requests:
                diarizer.receive_embeddings(requests, conversation.embed(requests))
        offset = diarizer.tracker.labels()[-1].end - len(conversation.samples) if diarizer.tracker.labels() else 0
        for i in range(3):
            final = conversation.final(i)
            moved = tuple(Word(w.text, w.start + offset, w.end + offset, w.probability) for w in final.words)
            diarizer.receive_events([Final(segment, final.text, final.start + offset, final.end + offset, moved, 0)])
            segment += 1
        diarizer.events_received()
    assert len(diarizer._buffer) <= 2 * diarizer.options.window_samples
    assert len(diarizer.tracker.labels()) < 200


def test_a_transcript_s_speaker_is_the_one_whose_words_last_longest() -> None:
    words = (Word("a", 0, 10, 1.0, 0), Word("b", 10, 15, 1.0, 1), Word("c", 15, 20, 1.0, 1), Word("d", 20, 30, 1.0, 2))
    assert final_speaker(words) == 0  # three equal: the earliest to speak
    assert final_speaker((Word("a", 0, 10, 1.0, 1), Word("b", 10, 30, 1.0, 0))) == 0
    assert final_speaker((Word("a", 0, 10, 1.0),)) is None
