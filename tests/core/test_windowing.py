from __future__ import annotations

import numpy as np
import pytest

from streamer.core.windowing import AudioBuffer, Window, WindowPolicy, next_window


def test_buffer_slices_by_absolute_position_and_trims() -> None:
    buf = AudioBuffer()
    data = np.arange(5000, dtype=np.float32)
    for i in range(0, 5000, 333):
        buf.append(data[i : i + 333])
    assert (buf.start, buf.end) == (0, 5000)
    np.testing.assert_array_equal(buf.slice(1200, 1300), data[1200:1300])
    buf.trim_before(4000)
    assert buf.start == 4000 and len(buf) == 1000
    np.testing.assert_array_equal(buf.slice(4500, 5000), data[4500:])
    with pytest.raises(ValueError):
        buf.slice(3999, 4100)
    with pytest.raises(ValueError):
        buf.slice(4900, 5001)


def test_buffer_memory_stays_bounded_when_trimmed() -> None:
    buf = AudioBuffer()
    chunk = np.ones(1600, dtype=np.float32)
    for _ in range(6000):  # ten minutes at 16 kHz
        buf.append(chunk)
        buf.trim_before(buf.end - 16000 * 5)
    assert buf.end == 6000 * 1600
    assert buf.capacity <= 1.25 * (16000 * 5 + 1600) + 1


def test_buffer_storage_grows_by_a_quarter_not_double() -> None:
    buf = AudioBuffer()
    data = np.arange(20 * 16000, dtype=np.float32)
    for i in range(0, data.size, 1600):  # a 20 s utterance arriving in 100 ms chunks, nothing trimmed
        buf.append(data[i : i + 1600])
    assert data.size <= buf.capacity <= 1.25 * data.size + 1
    np.testing.assert_array_equal(buf.slice(0, data.size), data)


def test_buffer_compacts_in_place_when_the_dead_room_suffices() -> None:
    buf = AudioBuffer()
    data = np.arange(110_000, dtype=np.float32)
    buf.append(data[:80_000])
    capacity = buf.capacity
    buf.trim_before(30_000)  # dead room at the front, less than half of the storage
    buf.append(data[80_000:])  # does not fit after the live samples, fits once they move to the front
    assert buf.capacity == capacity
    np.testing.assert_array_equal(buf.slice(30_000, 110_000), data[30_000:])


def test_window_due_every_step_of_new_speech() -> None:
    p = WindowPolicy(step=16000, max_window=480000)
    assert next_window(p, committed=0, decoded=0, speech_end=15999, closed=False) is None
    assert next_window(p, 0, 0, 16000, False) == Window(0, 16000, False)
    assert next_window(p, 0, 16000, 20000, False) is None
    # coalescing: whatever arrived meanwhile is in the next window
    assert next_window(p, 8000, 16000, 64000, False) == Window(8000, 64000, False)


def test_closed_utterance_gets_one_final_window_and_windows_are_capped() -> None:
    p = WindowPolicy(step=16000, max_window=480000)
    assert next_window(p, 0, 16000, 20000, True) == Window(0, 20000, True)
    assert next_window(p, 20000, 20000, 20000, True) is None
    assert next_window(p, 0, 0, 600000, False) == Window(120000, 600000, False)
    assert len(Window(5, 10, True)) == 5
