from __future__ import annotations

import json

import numpy as np

from streamer.integrations.call_centre import CallCentre, CallCentreOptions
from streamer.integrations.twilio import Start, TrackName, parse_message, recorded_messages


def test_no_webhook_without_a_url() -> None:
    assert CallCentre(CallCentreOptions()).webhook is None


async def test_stopping_ends_the_calls_that_wait_for_another_stream() -> None:
    integrations = CallCentre(CallCentreOptions())
    ended: list[str] = []
    integrations.hub.add_listener(lambda event: ended.append(event.type.value))
    start = parse_message(json.dumps(list(recorded_messages({TrackName.INBOUND: np.zeros(160, np.float32)}))[1]))
    assert isinstance(start, Start)
    integrations.calls.open(start, {TrackName.INBOUND: "customer"}, now=0.0).end("stopped", {})
    assert ended[-1] == "stream_ended" and start.call_sid in integrations.calls  # waiting out its grace period
    await integrations.stop()
    assert ended[-1] == "call_ended" and start.call_sid not in integrations.calls
