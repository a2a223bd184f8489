from __future__ import annotations

import random

import pytest

from streamer.core.audio import AudioFormat, Encoding
from streamer.core.errors import ConfigError, InvalidState
from streamer.reconnect import AudioRing, Backoff, ReconnectOptions, SendLog, SessionCursor, should_reconnect
from streamer.server.server_messages import FinalMessage, LostRange, PartialMessage, Ready, WordMessage

MONO = AudioFormat(Encoding.PCM_S16LE, 16000, 1)


def frames(first: int, count: int, frame_bytes: int = 2) -> bytes:
    """``count`` frames whose bytes name their frame number (mod 256), from frame ``first``."""
    return b"".join(bytes([(first + i) % 256]) * frame_bytes for i in range(count))


def final(seq: int, start: float, end: float, channel: int = 0) -> FinalMessage:
    word = WordMessage(f"w{seq}", start, end, 0.9)
    return FinalMessage(channel, seq, f" w{seq}", start, end, (word,), 10.0, seq=seq)


def ready(session_id: str = "s1", resumed: bool = False, received: float = 0.0) -> Ready:
    return Ready(
        session_id,
        "tiny.en",
        16000,
        "pcm_s16le",
        1,
        resumed=resumed,
        audio_seconds_received=received,
        resume_from=received,
    )


# -- the back-off ------------------------------------------------------------------------------------------------------


def test_backoff_doubles_within_its_jitter_up_to_the_cap_then_gives_up() -> None:
    options = ReconnectOptions(first_delay=0.25, multiplier=2.0, max_delay=2.0, jitter=0.5, max_attempts=6)
    backoff = Backoff(options, random.Random(7))
    delays = [backoff.next_delay(now=0.0) for _ in range(6)]
    ceilings = [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert delay is not None and ceiling * 0.5 <= delay <= ceiling
    assert len({round(d or 0, 6) for d in delays[3:]}) == 3  # jittered: capped delays still differ
    assert backoff.next_delay(now=0.0) is None  # six attempts, then no more
    backoff.reset()
    assert backoff.next_delay(now=100.0) == pytest.approx(0.25, rel=0.5)


def test_backoff_stops_at_its_time_bound_and_never_sleeps_past_it() -> None:
    backoff = Backoff(ReconnectOptions(first_delay=4.0, max_delay=4.0, jitter=0.0, max_seconds=10.0))
    assert backoff.next_delay(now=0.0) == 4.0
    assert backoff.next_delay(now=8.0) == 2.0  # the last attempt is made at the bound
    assert backoff.next_delay(now=10.0) is None


def test_clients_cut_at_once_come_back_spread_out() -> None:
    options = ReconnectOptions()
    firsts = [Backoff(options, random.Random(seed)).next_delay(0.0) for seed in range(50)]
    assert len({round(d or 0, 4) for d in firsts}) > 40
    assert min(d or 0 for d in firsts) >= options.first_delay * (1 - options.jitter)


@pytest.mark.parametrize(
    "field",
    [
        {"buffer_seconds": 0},
        {"first_delay": 0},
        {"first_delay": 9, "max_delay": 5},
        {"multiplier": 0.5},
        {"jitter": 1.5},
        {"max_attempts": 0},
        {"max_seconds": 0},
    ],
)
def test_reconnect_options_name_the_bad_field(field: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=next(iter(field))):
        ReconnectOptions(**field).validate()  # type: ignore[arg-type]


def test_which_closes_are_worth_a_resume() -> None:
    assert should_reconnect(None) and should_reconnect(1006) and should_reconnect(1001) and should_reconnect(1013)
    assert not any(should_reconnect(code) for code in (1000, 4400, 4401, 4404, 4415, 4429, 1009))


# -- the ring ----------------------------------------------------------------------------------------------------------


def test_the_ring_replays_from_any_frame_it_holds() -> None:
    ring = AudioRing(capacity=100, frame_bytes=2)
    ring.append(frames(0, 30))
    ring.append(frames(30, 20))
    assert (ring.start, ring.end) == (0, 50)
    replay = ring.replay(35)
    assert replay.silence == 0 and replay.data == frames(35, 15)
    ring.release(40)  # a final covers frames before 40
    assert ring.start == 40 and ring.replay(40).data == frames(40, 10)
    assert ring.replay(50).data == b""
    ring.release(10)  # an older release changes nothing
    assert ring.start == 40
    with pytest.raises(InvalidState):
        ring.replay(51)  # the server cannot have more than was sent


def test_a_full_ring_drops_the_oldest_and_a_replay_names_them_as_silence() -> None:
    ring = AudioRing(capacity=40, frame_bytes=2)
    for first in range(0, 100, 10):
        ring.append(frames(first, 10))
    assert (ring.start, ring.end, ring.dropped) == (60, 100, 60)
    replay = ring.replay(45)
    assert replay.silence == 15 and replay.data == frames(60, 40)


def test_the_ring_takes_whole_frames_only() -> None:
    ring = AudioRing(capacity=10, frame_bytes=4)
    with pytest.raises(InvalidState):
        ring.append(b"\x00" * 6)


# -- the cursor --------------------------------------------------------------------------------------------------------


def test_finals_already_received_are_dropped_and_the_ring_may_let_go_of_what_they_cover() -> None:
    cursor = SessionCursor(MONO)
    cursor.ready(ready())
    assert cursor.receive(final(1, 0.0, 1.5)) == final(1, 0.0, 1.5)
    assert cursor.receive(final(2, 1.5, 2.0)) is not None
    # the ring keeps 30 s before the end of the last final: the context a takeover re-reads (here: all of it)
    assert cursor.committed_point() == 32000 and cursor.release_point() == 0
    assert cursor.resume_query() == "resume=s1&last_seq=2"
    cursor.receive(final(3, 40.0, 42.0))
    assert cursor.release_point() == 12 * 16000
    # the resume says where the ring starts: a replica taking the session over asks for nothing before it
    assert cursor.resume_query(12 * 16000 + 7) == "resume=s1&last_seq=3&resend_from=12.000438"
    assert cursor.resume_query(0) == "resume=s1&last_seq=3"
    # after a resume the server replays what the client may have missed: seq 3 again is dropped, 4 is new
    assert cursor.receive(final(3, 40.0, 42.0)) is None
    assert cursor.receive(final(4, 42.0, 42.5)) is not None
    assert cursor.duplicates == 1 and cursor.last_seq == 4


def test_a_resume_sends_from_the_offset_the_server_names() -> None:
    cursor = SessionCursor(AudioFormat(Encoding.MULAW, 8000, 1))
    cursor.ready(ready())
    assert cursor.resume_frame(ready(resumed=True, received=2.5)) == 20000  # client frames at 8 kHz


def test_stereo_releases_only_what_both_channels_made_final() -> None:
    cursor = SessionCursor(AudioFormat(Encoding.PCM_S16LE, 16000, 2))
    cursor.receive(final(1, 0.0, 2.0, channel=0))
    assert cursor.release_point() == 0
    cursor.receive(final(2, 0.0, 1.0, channel=1))
    assert cursor.committed_point() == 16000


def test_a_new_session_after_a_refused_resume_continues_the_first_ones_times_and_seqs() -> None:
    cursor = SessionCursor(MONO)
    cursor.ready(ready("s1"))
    cursor.receive(final(1, 0.0, 1.0))
    cursor.receive(final(2, 1.0, 2.5))
    assert cursor.restart() == 40000  # send again from the end of the last final
    assert cursor.resume_query() == ""
    cursor.ready(ready("s2"))
    shifted = cursor.receive(final(1, 0.5, 1.0))
    assert isinstance(shifted, FinalMessage)
    assert (shifted.seq, shifted.start, shifted.end) == (3, 3.0, 3.5)
    assert (shifted.words[0].start, shifted.words[0].end) == (3.0, 3.5)
    partial = cursor.receive(PartialMessage(0, 1, " w", 1.0, 1.2, (), 5.0))
    assert isinstance(partial, PartialMessage) and partial.start == 3.5
    assert cursor.resume_query() == "resume=s2&last_seq=1"  # in the new server session's numbering
    # ... and its stream time: the ring's start, frame 48000 of the client's, is 0.5 s into the new session
    assert cursor.resume_query(48000) == "resume=s2&last_seq=1&resend_from=0.500000"
    assert cursor.resume_frame(ready("s2", resumed=True, received=1.0)) == 56000


def test_a_replay_that_had_to_send_silence_is_reported_lost_after_the_last_final_only() -> None:
    cursor = SessionCursor(MONO)
    ring = AudioRing(capacity=16000, frame_bytes=2)
    for first in range(0, 48000, 1600):
        ring.append(frames(first, 1600))
    replay = ring.replay(24000)
    cursor.note_replay(replay)
    assert cursor.lost == [LostRange(1.5, 2.0)]
    # before the end of the last final the audio was transcribed already: a takeover re-reads it as context only
    cursor.lost.clear()
    cursor.receive(final(1, 0.0, 1.75))
    cursor.note_replay(ring.replay(16000))
    assert cursor.lost == [LostRange(1.75, 2.0)]
    cursor.lost.clear()
    cursor.receive(final(2, 1.75, 2.0))
    cursor.note_replay(ring.replay(16000))
    assert cursor.lost == []


def test_a_resume_of_another_session_is_a_bug() -> None:
    cursor = SessionCursor(MONO)
    cursor.ready(ready("s1"))
    with pytest.raises(InvalidState):
        cursor.ready(ready("s9", resumed=True))


# -- the send log: when each frame went out, for the speaker-felt delay ------------------------------------------------


def test_the_send_log_names_when_the_audio_before_a_time_was_sent() -> None:
    log = SendLog(16000)
    log.record(1600, now=5.0)  # frames [0, 1600): 0.0-0.1 s
    log.record(1600, now=5.1)  # [1600, 3200): 0.1-0.2 s
    log.record(0, now=9.0)  # nothing sent: nothing noted
    # a word ending at 0.1 s ends with frame 1599, sent in the first chunk
    assert log.sent_at(0.1) == 5.0
    assert log.sent_at(0.1 + 1 / 16000) == 5.1
    assert log.sent_at(0.2) == 5.1
    assert log.sent_at(0.0) == 5.0
    assert log.sent_at(0.25) is None  # not sent yet
    assert (log.end, len(log)) == (3200, 2)


def test_the_send_log_forgets_only_what_no_later_final_can_refer_to() -> None:
    log = SendLog(16000)
    for i in range(4):
        log.record(1600, now=float(i))
    # the last final ended at 0.2 s (frame 3200): a later one ends after it, so frame 3199 on is kept
    log.prune(3200)
    assert log.sent_at(0.2) == 1.0
    assert log.sent_at(0.3) == 2.0
    assert log.sent_at(0.1) is None  # before the last final: no final will ask
    assert len(log) == 3


def test_the_send_log_stays_bounded_through_a_long_silence() -> None:
    # an hour of 100 ms chunks and no final: at most the horizon's audio is kept, and it still answers right
    log = SendLog(16000, horizon_seconds=60.0)
    for i in range(36_000):
        log.record(1600, now=i * 0.1)
    assert len(log) == 600
    assert log.sent_at(3600.0) == pytest.approx(3599.9)
    assert log.sent_at(3540.05) == pytest.approx(3540.0)
    assert log.sent_at(3539.9) is None


def test_a_send_log_needs_a_rate_and_a_horizon() -> None:
    with pytest.raises(ConfigError):
        SendLog(0)
    with pytest.raises(ConfigError):
        SendLog(16000, horizon_seconds=0.0)
