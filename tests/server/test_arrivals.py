from __future__ import annotations

from streamer.server.arrivals import ArrivalLog


def test_the_arrival_of_a_count_is_the_first_record_that_reaches_it() -> None:
    log = ArrivalLog()
    assert log.arrival_of(100) is None
    for n, t in ((1600, 1.0), (3200, 1.1), (4800, 1.2)):
        log.record(n, t)
    assert log.arrival_of(1) == 1.0
    assert log.arrival_of(1600) == 1.0
    assert log.arrival_of(1601) == 1.1
    assert log.arrival_of(4800) == 1.2
    assert log.arrival_of(99999) == 1.2  # not arrived yet: the newest record


def test_forgetting_keeps_every_answer_at_or_after_the_count_and_bounds_the_log() -> None:
    log = ArrivalLog()
    for frame in range(1, 36001):  # an hour of 100 ms frames
        log.record(frame * 1600, frame / 10)
        if frame % 64 == 0 and frame > 300:
            log.forget_before(frame * 1600 - 30 * 16000)  # what is still needed: the last 30 s
            assert log.arrival_of(frame * 1600 - 30 * 16000) == (frame - 300) / 10
    assert len(log) <= 2 * (300 + 64)
    assert log.arrival_of(36000 * 1600) == 3600.0
