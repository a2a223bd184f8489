from __future__ import annotations

import re
from collections import Counter as Tally

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from streamer.server.metrics_merge import merge_expositions


def exposition(requests: dict[str, float], gauge: float, observations: list[float], extra: bool = False) -> str:
    """What one worker's registry renders: a labelled counter, a gauge, a histogram, and with ``extra`` a gauge the
    other workers lack."""
    registry = CollectorRegistry()
    counter = Counter("streamer_requests", "Requests by route.", ["route"], registry=registry)
    for route, count in requests.items():
        counter.labels(route=route).inc(count)
    Gauge("streamer_sessions_active", "Open sessions.", registry=registry).set(gauge)
    histogram = Histogram("streamer_latency_seconds", "Latency.", buckets=(0.1, 0.5, 1.0), registry=registry)
    for seconds in observations:
        histogram.observe(seconds)
    if extra:
        Gauge("streamer_only_here", "Only one worker has it.", registry=registry).set(7)
    return generate_latest(registry).decode()


def samples(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def sample_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_two_registries_merge_into_one_exposition_with_every_sample_labelled() -> None:
    texts = {
        "0": exposition({"/v1/listen": 3, "/twilio": 1}, 2, [0.05, 0.7]),
        "1": exposition({"/v1/listen": 5}, 4, [0.3, 0.3, 2.0], extra=True),
    }
    merged = merge_expositions(texts)
    assert merged.endswith("\n")

    names = [family.name for family in text_string_to_metric_families(merged)]
    assert len(names) == len(set(names))  # interleaved samples would split a family in two
    assert "streamer_only_here" in names

    expected = Tally(
        (name, tuple(sorted((*labels, ("worker", worker)))), value)
        for worker, text in texts.items()
        for name, labels, value in samples(text)
    )
    assert Tally(samples(merged)) == expected
    # the label comes first in every sample, not after the others
    assert all(re.match(r'[a-z_]+\{worker="[01]"[,}]', line) for line in sample_lines(merged))

    # each family's HELP and TYPE once, and the family present in worker 1 only keeps its header
    assert merged.count("# HELP streamer_requests_total Requests by route.\n") == 1
    assert merged.count("# TYPE streamer_latency_seconds histogram\n") == 1
    assert '# TYPE streamer_only_here gauge\nstreamer_only_here{worker="1"} 7.0\n' in merged


def test_samples_of_a_family_stay_together_worker_by_worker_and_families_keep_first_seen_order() -> None:
    texts = {
        "a": "# HELP x X.\n# TYPE x gauge\nx 1.0\n# HELP h H.\n# TYPE h histogram\n"
        'h_bucket{le="+Inf"} 1.0\nh_count 1.0\nh_sum 0.5\n',
        "b": "# HELP y Y.\n# TYPE y gauge\ny 3.0\n# HELP x Other help.\n# TYPE x gauge\nx 2.0\n"
        "# HELP h H.\n# TYPE h histogram\n"
        'h_bucket{le="+Inf"} 2.0\nh_count 2.0\nh_sum 1.5\n',
    }
    assert merge_expositions(texts) == (
        "# HELP x X.\n# TYPE x gauge\n"
        'x{worker="a"} 1.0\nx{worker="b"} 2.0\n'
        "# HELP h H.\n# TYPE h histogram\n"
        'h_bucket{worker="a",le="+Inf"} 1.0\nh_count{worker="a"} 1.0\nh_sum{worker="a"} 0.5\n'
        'h_bucket{worker="b",le="+Inf"} 2.0\nh_count{worker="b"} 2.0\nh_sum{worker="b"} 1.5\n'
        "# HELP y Y.\n# TYPE y gauge\n"
        'y{worker="b"} 3.0\n'
    )


def test_the_label_goes_first_without_reading_the_label_values() -> None:
    value = r"a},b=\"c\",d} e\\"
    text = f'# TYPE m counter\nm_total{{route="{value}",code="200"}} 4.0\n'
    merged = merge_expositions({"0": text})
    assert merged == f'# TYPE m counter\nm_total{{worker="0",route="{value}",code="200"}} 4.0\n'
    ((_, labels, _),) = samples(merged)
    assert dict(labels) == {"worker": "0", "route": 'a},b="c",d} e\\', "code": "200"}
    # an empty label set, and a trailing comma, stay well formed
    assert merge_expositions({"0": 'm{} 1\nn{a="b",} 2\n'}) == 'm{worker="0"} 1\nn{worker="0",a="b",} 2\n'


def test_a_worker_name_is_escaped_as_a_label_value() -> None:
    worker = 'pod "7"\\a\nb'
    merged = merge_expositions({worker: "# TYPE g gauge\ng 1.0\n"}, label="pod")
    assert merged == '# TYPE g gauge\ng{pod="pod \\"7\\"\\\\a\\nb"} 1.0\n'
    (family,) = text_string_to_metric_families(merged)
    assert family.samples[0].labels == {"pod": worker}


def test_a_sample_that_already_has_the_label_is_refused() -> None:
    with pytest.raises(ValueError, match="already has the label 'worker'"):
        merge_expositions({"0": 'g{a="worker=\\"x\\"",worker="1"} 1.0\n'})
    # the label's name inside another label's value is not the label
    assert merge_expositions({"0": 'g{a="worker=\\"x\\""} 1.0\n'}) == 'g{worker="0",a="worker=\\"x\\""} 1.0\n'
    with pytest.raises(ValueError, match="not a Prometheus label name"):
        merge_expositions({"0": "g 1.0\n"}, label="bad-label")


def test_empty_input_gives_an_empty_exposition() -> None:
    assert merge_expositions({}) == ""
    assert merge_expositions({"0": "", "1": "\n\n"}) == ""


def test_timestamps_are_kept() -> None:
    text = '# TYPE g gauge\ng 1.5 1700000000000\ng2{a="b"} 2.5 1700000000001\n'
    merged = merge_expositions({"0": text, "1": text})
    assert sample_lines(merged) == [
        'g{worker="0"} 1.5 1700000000000',
        'g2{worker="0",a="b"} 2.5 1700000000001',
        'g{worker="1"} 1.5 1700000000000',
        'g2{worker="1",a="b"} 2.5 1700000000001',
    ]
    parsed = {
        (s.name, s.labels["worker"]): s.timestamp for f in text_string_to_metric_families(merged) for s in f.samples
    }
    assert parsed == {
        ("g", "0"): 1700000000.0,
        ("g2", "0"): 1700000000.001,
        ("g", "1"): 1700000000.0,
        ("g2", "1"): 1700000000.001,
    }


def test_blank_lines_and_other_comments_are_dropped_and_headerless_samples_are_their_own_family() -> None:
    texts = {
        "0": "up 1\n\n# a comment\n# HELP g G.\n# TYPE g gauge\n\ng 1.0\n",
        "1": "up 0\n# HELP g G again.\n# TYPE g gauge\ng 2.0\n",
    }
    assert merge_expositions(texts) == (
        'up{worker="0"} 1\nup{worker="1"} 0\n# HELP g G.\n# TYPE g gauge\ng{worker="0"} 1.0\ng{worker="1"} 2.0\n'
    )


def test_a_line_that_is_not_a_sample_is_refused() -> None:
    for line in ("1.0\n", 'g{a="unterminated} 1.0\n', "g-h 1.0\n"):
        with pytest.raises(ValueError, match="worker '0'"):
            merge_expositions({"0": line})
