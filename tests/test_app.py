"""The composition root (:mod:`streamer.app`): every endpoint of ``streamer serve`` in one table, each row with its
policy and its endpoint, and the server that serves it with the call centre beside."""

from __future__ import annotations

import pytest

from streamer.app import App, route_table
from streamer.engine.fake import ScriptedEngine
from streamer.integrations.call_centre import CallCentre, CallCentreOptions
from streamer.server.metrics import ServerMetrics
from streamer.server.routes import Admission, AuthRule
from streamer.server.serve import ServerConfig
from tests.helpers import WORDS, until

TABLE = route_table(CallCentre(CallCentreOptions()))


def test_every_endpoint_is_a_row_with_its_policy() -> None:
    names = {r.name: r for r in TABLE.routes}
    assert {"listen", "realtime", "twilio", "call_events", "token", "status"} <= set(names)
    for name in ("listen", "realtime", "twilio"):
        policy = names[name].policy
        assert policy.admission is Admission.STREAM and policy.audio_rate_limit and policy.check_origin
    # the Deepgram-compatible endpoint is refused and limited exactly as the native one
    assert names["deepgram"].policy == names["listen"].policy and names["deepgram"].path == "/deepgram/v1/listen"
    assert names["call_events"].policy.admission is Admission.FOLLOWER
    assert names["call_events"].policy.auth is AuthRule.KEY_OR_TOKEN
    assert names["twilio"].policy.auth is AuthRule.TWILIO_SIGNATURE
    assert names["status"].policy.auth is AuthRule.API_KEY
    match = TABLE.match("/v1/calls/CA1.2_x-y/events")
    assert match is not None and match.route.name == "call_events" and match.params == {"call_sid": "CA1.2_x-y"}
    assert TABLE.match("/v1/calls/../events") is None and TABLE.match("/v1/listen/x") is None


def test_the_page_is_the_last_row_and_every_name_is_served_by_its_endpoint() -> None:
    names = [r.name for r in TABLE.routes]
    assert names[-2:] == ["page", "page_file"]  # "/{file}" matches every one-segment path
    assert TABLE.token_paths == {"/v1/listen", "/v1/realtime", "/deepgram/v1/listen", "/v1/calls/{call_sid}/events"}


def test_the_route_table_says_which_routes_take_a_body() -> None:
    assert TABLE.body_limit("/v1/realtime/client_secrets") == 64 * 1024
    assert TABLE.body_limit("/v1/token") == TABLE.body_limit("/v1/realtime") == TABLE.body_limit("/nowhere") == 0


@pytest.mark.parametrize(
    ("route", "label"),
    [("listen", "listen"), ("realtime", "realtime"), ("twilio", "twilio"), ("events", "other"), ("x", "other")],
)
def test_the_route_label_takes_only_stream_routes(route: str, label: str) -> None:
    assert set(TABLE.stream_names) == {"listen", "realtime", "deepgram", "twilio"}
    assert ServerMetrics(TABLE.stream_names).route_label(route) == label


async def test_the_app_runs_the_call_centre_as_a_service_with_the_servers_limits() -> None:
    config = ServerConfig(port=0)
    async with App(config, ScriptedEngine(WORDS)) as app:
        assert app.services == (app.call_centre,) and app.call_centre in app.collectors()
        assert app.call_centre.options.twilio.rate_limit == config.session.rate_limit
        assert app.gates[Admission.FOLLOWER].limit == CallCentreOptions().hub.max_followers
        await until(lambda: app.healthy)
