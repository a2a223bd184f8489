"""The Kubernetes manifests under docker/k8s: valid against the API's schemas (offline, kubernetes-validate), and in
step with the server they run: probe paths, the drain budget, the autoscaler's metrics, the container's arguments."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from streamer.app import App
from streamer.cli.main import build_parser
from streamer.engine.fake import ScriptedEngine
from streamer.server.metrics import ServerMetrics
from streamer.server.redis_link import REDIS_URL_ENV
from streamer.server.serve import ServerConfig
from tests.helpers import WORDS, config, http_get

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S = Path(__file__).parent.parent / "docker" / "k8s"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
# the oldest Kubernetes these manifests promise to work on (autoscaling/v2 and policy/v1 are GA since 1.23/1.21)
KUBERNETES_VERSION = "1.30.0"


def load(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((K8S / name).read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    return document


def quantity(value: str | int) -> float:
    """A Kubernetes quantity without a binary suffix: 3, "3", "1500m"."""
    text = str(value)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def container() -> dict[str, Any]:
    (main,) = load("deployment.yaml")["spec"]["template"]["spec"]["containers"]
    assert isinstance(main, dict)
    return main


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_manifest_is_valid_against_the_kubernetes_schema(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        # strict: an unknown or misspelt field fails, rather than being dropped by the API server
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_kustomization_applies_every_manifest() -> None:
    assert sorted(load("kustomization.yaml")["resources"]) == [p.name for p in MANIFESTS]


def test_container_arguments_are_ones_streamer_serve_takes() -> None:
    main = container()
    entrypoint = ["-v", "serve", "--host", "0.0.0.0", "--port", "8765", "--log-format", "json"]
    args = build_parser().parse_args([*entrypoint, *main["args"]])
    assert args.threads == int(main["resources"]["requests"]["cpu"])  # one torch thread per CPU requested
    assert main["ports"][0]["containerPort"] == args.port


def test_probes_point_at_readyz_and_healthz() -> None:
    main = container()
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


async def test_the_probe_paths_answer_as_the_probes_expect() -> None:
    main = container()
    ready, alive = main["readinessProbe"]["httpGet"]["path"], main["livenessProbe"]["httpGet"]["path"]
    async with App(config(), engine=None) as srv:
        # loading the model: alive (no restart) but not ready (no traffic)
        assert (await http_get(srv.port, alive))[0] == 200
        assert (await http_get(srv.port, ready))[0] == 503
        srv.set_engine(ScriptedEngine(WORDS))
        assert (await http_get(srv.port, ready))[0] == 200


def test_the_grace_period_covers_the_prestop_sleep_and_the_drain() -> None:
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    command = container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    drain = ServerConfig().shutdown_timeout
    assert pod["terminationGracePeriodSeconds"] >= int(command[1]) + drain + 5


def test_the_security_context_matches_the_image_user() -> None:
    pod = load("deployment.yaml")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    dockerfile = (K8S.parent / "Dockerfile.cpu").read_text(encoding="utf-8")
    (user,) = re.findall(r"^USER (\d+):\d+$", dockerfile, flags=re.MULTILINE)
    assert pod["securityContext"]["runAsUser"] == int(user)
    assert container()["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_autoscaler_scales_on_gauges_the_server_exports_through_the_adapter() -> None:
    hpa = load("hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"]["name"] == load("deployment.yaml")["metadata"]["name"]
    metrics = hpa["spec"]["metrics"]
    assert {m["type"] for m in metrics} == {"Pods"}  # per-pod custom metrics, not CPU
    names = [m["pods"]["metric"]["name"] for m in metrics]
    exported = ServerMetrics().render()
    for name in names:
        assert f"# TYPE {name} gauge\n" in exported
    rules = yaml.safe_load(load("prometheus-adapter-config.yaml")["data"]["config.yaml"])["rules"]
    assert sorted(rule["name"]["as"] for rule in rules) == sorted(names)
    for rule in rules:
        assert rule["seriesQuery"].startswith(rule["name"]["as"] + "{")
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    # the sessions target sits below the per-pod limit: pods are added before any refuses a session
    max_sessions = build_parser().parse_args(["serve", *container()["args"]]).max_sessions
    (sessions,) = [m for m in metrics if m["pods"]["metric"]["name"] == "streamer_active_sessions"]
    assert 0 < quantity(sessions["pods"]["target"]["averageValue"]) < max_sessions


def test_disruptions_take_one_pod_at_a_time() -> None:
    pdb = load("pdb.yaml")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == load("deployment.yaml")["spec"]["selector"]
    assert load("service.yaml")["spec"]["selector"] == pdb["spec"]["selector"]["matchLabels"]


def test_replicas_share_state_through_redis_without_session_affinity() -> None:
    assert load("service.yaml")["spec"]["sessionAffinity"] == "None"
    env = {e["name"]: e for e in container()["env"]}
    assert env[REDIS_URL_ENV]["valueFrom"]["secretKeyRef"] == {"name": "streamer-redis", "key": "url"}
    deployment, service = yaml.safe_load_all((K8S / "redis.yaml").read_text(encoding="utf-8"))
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"] == labels and service["spec"]["ports"][0]["port"] == 6379
    # the URL the file tells operators to put in the Secret names this Service
    assert f"redis://{service['metadata']['name']}:6379/0" in (K8S / "redis.yaml").read_text(encoding="utf-8")
    # every key is short-lived: the in-cluster Redis keeps nothing on disk
    (redis,) = deployment["spec"]["template"]["spec"]["containers"]
    assert redis["args"][:4] == ["--save", "", "--appendonly", "no"]
