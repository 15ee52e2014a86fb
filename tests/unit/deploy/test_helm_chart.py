"""The Helm chart (deploy/helm/llmq) checked without a cluster: `helm lint` and `helm template` for the default values
and every region's values file; every rendered object against the JSON schemas of a pinned Kubernetes version
(kubernetes-validate, offline, strict) or of its operator's CRD (deploy/helm/schemas); every environment variable a
real setting; the render-time partition checks; drain, probes, security and autoscaling as the docs say.

Needs the pinned helm that `make helm` (part of `make setup`) builds; skipped, saying so, without it."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from llmq_cli import mirror as mirror_config
from llmq_cli.devstack import StackConfig
from llmq_cli.kafka_dist import KAFKA_VERSION
from llmq_core import constants, security
from llmq_core.settings import Settings, load_settings
from tests.helm_chart import CHART, KUBE_VERSION, ROOT, helm, needs_helm, objects, template

SCHEMAS = ROOT / "deploy" / "helm" / "schemas"
REGION_VALUES = sorted((ROOT / "deploy" / "helm" / "values").glob("*.yaml"))
SETTINGS = set(Settings.variables())
KUBERNETES_DOC = (ROOT / "docs" / "operations" / "kubernetes.md").read_text()
KAFKA_DOCKERFILE = (ROOT / "deploy" / "images" / "kafka.Dockerfile").read_text()
AUTOSCALING_DOC = (ROOT / "docs" / "operations" / "observability.md").read_text()  # the autoscaling table

pytestmark = needs_helm
VALUES = [None, *REGION_VALUES]
VALUE_IDS = ["default", *(path.stem for path in REGION_VALUES)]


@functools.cache
def rendered(values: Path | None) -> tuple[dict, ...]:
    return tuple(objects(*([values] if values else [])))


def of_kind(values: Path | None, kind: str) -> list[dict]:
    return [obj for obj in rendered(values) if obj["kind"] == kind]


def workloads(values: Path | None) -> list[dict]:
    return [obj for obj in rendered(values) if obj["kind"] in ("Deployment", "StatefulSet", "Job")]


def containers(values: Path | None) -> list[dict]:
    return [c for w in workloads(values) for c in w["spec"]["template"]["spec"]["containers"]]


def settings_map(values: Path | None) -> dict[str, str]:
    (config,) = [c for c in of_kind(values, "ConfigMap") if c["metadata"]["name"].endswith("-settings")]
    return config["data"]


def crd_schema(obj: dict) -> dict | None:
    group, version = obj["apiVersion"].split("/") if "/" in obj["apiVersion"] else ("", obj["apiVersion"])
    path = SCHEMAS / group / f"{obj['kind'].lower()}-{version}.json"
    return json.loads(path.read_text()) if group and path.exists() else None


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_helm_lint(values):
    files = ["-f", str(values)] if values else []
    result = helm("lint", "--strict", str(CHART), *files)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_every_object_matches_its_schema(values):
    """Kubernetes' own kinds against the pinned version's strict schemas, custom resources against their CRD's."""
    for obj in rendered(values):
        schema = crd_schema(obj)
        if schema is not None:
            jsonschema.Draft202012Validator(schema).validate(obj)
        else:  # a kind kubernetes-validate does not know fails here too (SchemaNotFoundError)
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_crd_schemas_reject_a_misspelt_field():
    (scaled,) = [o for o in of_kind(None, "ScaledObject") if o["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"]
    broken = {**scaled, "spec": {**scaled["spec"], "maxReplicas": 3}}
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        jsonschema.Draft202012Validator(crd_schema(broken)).validate(broken)


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_every_environment_variable_is_a_setting_and_parses(values, monkeypatch):
    """Each name the chart sets (env and the settings ConfigMap) is a field of Settings, and its value is valid."""
    configured = settings_map(values)
    names = set(configured) | {env["name"] for c in containers(values) for env in c.get("env", [])}
    assert names and names <= SETTINGS, sorted(names - SETTINGS)
    for name, value in configured.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()  # every group validated
    assert settings.region.name == configured["LLMQ_REGION"]
    assert settings.observability.metrics_host == "0.0.0.0"


@pytest.mark.parametrize("release,prefix", [("llmq", "llmq-"), ("prod", "prod-llmq-")])
def test_helm_template_as_a_user_types_it_renders_objects_named_once(release, prefix):
    """`helm template llmq deploy/helm/llmq` verbatim (no --kube-version) with the helm `make setup` builds: built
    without helm's version ldflags it assumed Kubernetes v1.20.0 and refused the chart's kubeVersion; and release
    `llmq` named every object `llmq-llmq-*`."""
    result = helm("template", release, str(CHART))
    assert result.returncode == 0, result.stderr + "\n(an old helm build without version ldflags: run `make helm`)"
    names = {doc["metadata"]["name"] for doc in yaml.safe_load_all(result.stdout) if doc}
    assert f"{prefix}api" in names and all(name.startswith(prefix) for name in names), sorted(names)
    assert not any("llmq-llmq" in name for name in names)


def test_region_values_name_their_region_and_mirror_the_others():
    regions = {path.stem for path in REGION_VALUES}
    assert len(regions) >= 2
    for path in REGION_VALUES:
        assert settings_map(path)["LLMQ_REGION"] == path.stem
        (mirror,) = [d for d in of_kind(path, "Deployment") if d["metadata"]["name"].endswith("-mirrormaker2")]
        command = mirror["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[-2:] == ["--clusters", path.stem]  # runs in the target region, after the properties file
        (config,) = [c for c in of_kind(path, "ConfigMap") if c["metadata"]["name"].endswith("-mirrormaker2")]
        properties = dict(
            line.split(" = ", 1) for line in config["data"]["mm2.properties"].splitlines() if " = " in line
        )
        assert properties["replication.policy.class"].endswith("DefaultReplicationPolicy")
        assert properties["sync.topic.acls.enabled"] == properties["sync.group.offsets.enabled"] == "false"
        for region in regions:  # every cluster's producer takes records up to llmq's record limit
            assert properties[f"{region}.producer.max.request.size"] == str(constants.KAFKA_MAX_MESSAGE_BYTES)
        flows = {key.split(".")[0]: value for key, value in properties.items() if key.endswith(".topics")}
        assert set(flows) == {f"{other}->{path.stem}" for other in regions - {path.stem}}
        for topics in flows.values():
            pattern = re.compile(topics.replace("\\\\", "\\"))  # a properties file escapes its backslashes
            assert pattern.fullmatch("llmq.jobs.lines") and pattern.fullmatch("llmq.results")
            assert not pattern.fullmatch("llmq.requests.interactive") and not pattern.fullmatch("llmqXresults")
        groups = {key.split(".")[0]: value for key, value in properties.items() if key.endswith(".groups")}
        assert set(groups) == set(flows)  # every flow checkpoints...
        assert set(groups.values()) == {mirror_config.CHECKPOINTED_GROUPS}  # ...llmq's own groups, as the dev mirror


def mirror_checksum(*sets: str) -> str:
    (mirror,) = [
        d
        for d in objects(REGION_VALUES[0], sets=sets)
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-mirrormaker2")
    ]
    return mirror["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


@pytest.mark.parametrize(
    "change",
    [
        "mirrorMaker.topics=llmq\\.results",
        "mirrorMaker.groups=llmq-batcher",
        "mirrorMaker.refreshTopicsIntervalS=5",
        "kafka.topicReplicationFactor=5",
        "kafka.bootstrapServers=other:9093",
    ],
)
def test_any_change_of_mirrormakers_config_changes_its_pod_template(change):
    """The pod template hashes the whole rendered mm2.properties, so helm upgrade restarts MirrorMaker 2 on any change
    of it (it hashed the cluster list only: new topics, groups or a refresh interval never took effect)."""
    assert mirror_checksum(change) != mirror_checksum()


def worker_ranges(values: Path | None) -> dict[str, range]:
    """Worker StatefulSet -> the partitions its pods own, read from the rendered command and ScaledObject."""
    largest = {
        o["spec"]["scaleTargetRef"]["name"]: o["spec"]["maxReplicaCount"] for o in of_kind(values, "ScaledObject")
    }
    ranges = {}
    for workers in of_kind(values, "StatefulSet"):
        script = workers["spec"]["template"]["spec"]["containers"][0]["command"][2]
        offset = int(re.search(r"\$\(\( (\d+) \+ \$\{HOSTNAME##\*-\} \)\)", script)[1])
        ranges[workers["metadata"]["name"]] = range(offset, offset + largest[workers["metadata"]["name"]])
    return ranges


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_every_container_runs_an_image_make_images_builds(values):
    """The values name the tags `make images` builds (deploy/images/build.sh) and docker-compose.yml runs."""
    version = importlib.metadata.version("llmq")
    built = {f"llmq:{version}", f"llmq-worker:{version}", f"llmq-kafka:{KAFKA_VERSION}"}
    images = {container["image"] for container in containers(values)}
    assert f"llmq:{version}" in images and images <= built, images - built
    for mirror in (c for c in containers(values) if c["name"] == "mirrormaker2"):  # the image's MirrorMaker 2 script
        assert mirror["image"] == f"llmq-kafka:{KAFKA_VERSION}" and mirror["command"][0] == "/opt/kafka/mirror.sh"
        assert re.search(r"^COPY .*\bmirror\.sh\b.* /opt/kafka/$", KAFKA_DOCKERFILE, re.M)


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_worker_partition_ranges_fit_and_do_not_overlap(values):
    partitions = int(settings_map(values)["LLMQ_KAFKA_BATCH_TOPIC_PARTITIONS"])
    owned = [p for r in worker_ranges(values).values() for p in r]
    assert owned and len(owned) == len(set(owned)) and max(owned) < partitions


def test_a_worker_pod_takes_offset_plus_its_ordinal():
    """The rendered shell command, run with `exec python -m ...` replaced by echo, as pod ordinal 3 of each model."""
    for workers in of_kind(REGION_VALUES[0], "StatefulSet"):
        name = workers["metadata"]["name"]
        script = workers["spec"]["template"]["spec"]["containers"][0]["command"][2]
        echo = script.replace("exec python -m llmq_worker.main", "echo", 1)
        out = subprocess.run(["sh", "-c", echo], env={"HOSTNAME": f"{name}-3"}, capture_output=True, text=True)
        argv = out.stdout.split()
        assert argv[argv.index("--worker-id") + 1] == f"{name}-3"
        assert int(argv[argv.index("--partition") + 1]) == worker_ranges(REGION_VALUES[0])[name].start + 3


MODELS_SET = "workers.models[{i}].{key}={value}"


def two_models(first: tuple[int, int], second: tuple[int, int]) -> tuple[str, ...]:
    """--set arguments for two simulated models, (offset, maxReplicas) each."""
    sets = []
    for i, (offset, largest) in enumerate((first, second)):
        fields = {"name": f"m{i}", "model": "llmq-sim", "engine": "simulated", "partitionOffset": offset}
        fields |= {"minReplicas": 0, "maxReplicas": largest, "shutdownGraceS": 10}
        sets += [MODELS_SET.format(i=i, key=key, value=value) for key, value in fields.items()]
    return tuple(sets)


@pytest.mark.parametrize(
    ("first", "second", "message"),
    [
        ((0, 10), (10, 7), "maxReplicas add up to 17, more than LLMQ_KAFKA_BATCH_TOPIC_PARTITIONS=16"),
        ((0, 6), (4, 6), "m0 and m1: partition ranges 0..5 and 4..9 overlap"),
        ((0, 2), (15, 2), "m1: partitions 15..16 pass the end of llmq.batches (LLMQ_KAFKA_BATCH_TOPIC_PARTITIONS=16)"),
    ],
)
def test_rendering_fails_on_partitions_that_do_not_fit(first, second, message):
    result = template(sets=two_models(first, second))
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_partitions_that_fit_exactly_render():
    result = template(sets=two_models((0, 10), (10, 6)))
    assert result.returncode == 0, result.stderr


def test_partition_message_says_how_to_grow_partitions():
    result = template(sets=two_models((0, 10), (10, 7)))
    assert 'docs/operations/kubernetes.md "Growing partitions"' in result.stderr
    assert "## Growing partitions" in KUBERNETES_DOC


def autoscaling_row(metric: str) -> tuple[str, str]:
    """(threshold, minutes) of the docs' autoscaling table's row whose query holds ``metric``."""
    rows = [line for line in AUTOSCALING_DOC.splitlines() if line.startswith("| ") and metric in line]
    (found,) = [m for row in rows if (m := re.search(r"\| > ([\d.]+)(?: s)? for (\d+) min", row))]
    return found[1], found[2]


@pytest.mark.parametrize(
    ("trigger", "metric"),
    [
        ("interactive-age", 'priority_class=~"interactive.*"'),
        ("near-interactive-age", 'priority_class="near_interactive"'),
        ("utilization", "avg(llmq_worker_utilization_ratio"),
    ],
)
def test_worker_triggers_are_the_documented_autoscaling_rows(trigger, metric):
    threshold, minutes = autoscaling_row(metric)
    for scaled in of_kind(None, "ScaledObject"):
        if scaled["spec"]["scaleTargetRef"]["kind"] == "StatefulSet":
            (found,) = [t for t in scaled["spec"]["triggers"] if t["name"] == trigger]
            assert found["metadata"]["threshold"] == threshold
            assert f"[{minutes}m:" in found["metadata"]["query"] and metric in found["metadata"]["query"]


def test_workers_scale_from_zero_and_in_slowly_enough_to_drain():
    (scaled,) = [o for o in of_kind(None, "ScaledObject") if o["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"]
    assert scaled["spec"]["minReplicaCount"] == 0
    (activation,) = [t for t in scaled["spec"]["triggers"] if t["name"] == "queued-demand"]
    assert activation["metadata"]["activationThreshold"] == "0"
    assert "priority_class" not in activation["metadata"]["query"]  # deferred work queues for a model without workers
    scale_down = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert scale_down["stabilizationWindowSeconds"] == 15 * 60  # the autoscaling table: "for 15 min"
    assert scale_down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 60}]


def scaled_object(name: str) -> dict:
    (scaled,) = [o for o in of_kind(None, "ScaledObject") if o["metadata"]["name"] == f"llmq-{name}"]
    return scaled


def test_api_pods_scale_on_their_in_flight_share():
    scaled = scaled_object("api")
    (trigger,) = scaled["spec"]["triggers"]
    row = next(line for line in AUTOSCALING_DOC.splitlines() if line.startswith("| API pods |"))
    assert f"> {trigger['metadata']['threshold']} |" in row
    assert f"* {Settings().api.max_in_flight})" in trigger["metadata"]["query"]


@pytest.mark.parametrize(
    ("name", "group", "partitions"),
    [
        ("batcher", "llmq-batcher", "LLMQ_KAFKA_REQUEST_TOPIC_PARTITIONS"),
        ("result-router", "llmq-result-router", "LLMQ_KAFKA_RESULTS_TOPIC_PARTITIONS"),
    ],
)
def test_batchers_and_routers_scale_on_their_groups_lag_up_to_one_per_partition(name, group, partitions):
    scaled = scaled_object(name)
    (trigger,) = scaled["spec"]["triggers"]
    threshold, minutes = autoscaling_row(f'llmq_kafka_consumer_lag{{group="{group}"}}')
    assert trigger["metadata"]["threshold"] == threshold and f"[{minutes}m:" in trigger["metadata"]["query"]
    assert f'group="{group}"' in trigger["metadata"]["query"]
    assert scaled["spec"]["maxReplicaCount"] == int(settings_map(None)[partitions])


def test_more_fixed_replicas_than_partitions_fail_to_render():
    result = template(sets=("batcher.replicas=5",))
    assert (
        result.returncode != 0 and "batcher: replicas 5 exceed LLMQ_KAFKA_REQUEST_TOPIC_PARTITIONS=4" in result.stderr
    )


def shutdown_grace_s(values: Path | None, container: dict) -> float:
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    return float(env.get("LLMQ_SHUTDOWN_GRACE_S", settings_map(values)["LLMQ_SHUTDOWN_GRACE_S"]))


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_termination_grace_covers_prestop_and_the_sigterm_drain(values):
    for workload in workloads(values):
        pod = workload["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        if container["name"] in ("topics", "mirrormaker2"):
            continue
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", ["sleep", "0"])
        assert pod["terminationGracePeriodSeconds"] > int(pre_stop[1]) + shutdown_grace_s(values, container)


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_probes_health_for_api_pods_metrics_for_the_others(values):
    for container in containers(values):
        if container["name"] == "api":
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
        elif container["name"] in ("batcher", "result-router", "worker"):
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_containers_run_unprivileged_on_a_read_only_root(values):
    for workload in workloads(values):
        pod = workload["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
            assert context["runAsUser"] != 0 and context["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_each_service_has_a_disruption_budget_and_is_scraped(values):
    budgets = [b["spec"]["selector"]["matchLabels"] for b in of_kind(values, "PodDisruptionBudget")]
    for workload in workloads(values):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if labels["app.kubernetes.io/component"] in ("topics", "mirrormaker2"):
            continue
        assert any(budget.items() <= labels.items() for budget in budgets), workload["metadata"]["name"]
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == settings_map(values)["LLMQ_METRICS_PORT"]


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_network_policies_deny_all_but_the_flows_design_needs(values):
    policies = {p["metadata"]["name"].removeprefix("llmq-"): p["spec"] for p in of_kind(values, "NetworkPolicy")}
    deny = policies["default-deny"]
    assert deny["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in deny and "egress" not in deny
    assert deny["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "llmq",
        "app.kubernetes.io/instance": "llmq",
    }
    assert [rule["ports"][0]["port"] for rule in policies["metrics"]["ingress"]] == [9100]
    (clients,) = policies["api-clients"]["ingress"]
    assert clients["ports"] == [{"protocol": "TCP", "port": 8000}]
    egress_ports = {port["port"] for rule in policies["kafka-redis"]["egress"] for port in rule["ports"]}
    assert egress_ports == {53, 9093, 6379}


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_topics_are_created_by_a_hook_with_the_replication_factor(values):
    (job,) = of_kind(values, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["llmq", "topics", "--acls"]  # a secure cluster: the ACLs first
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["LLMQ_KAFKA_SASL_USERNAME"] == "admin"
    wanted = yaml.safe_load(values.read_text())["kafka"]["topicReplicationFactor"] if values else 3
    assert env["LLMQ_KAFKA_TOPIC_REPLICATION_FACTOR"] == str(wanted)
    assert {k: v for k, v in env.items() if k in settings_map(values)} == settings_map(values)


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_the_hook_applies_the_acls_a_secure_dev_stack_applies_for_the_same_settings(values, monkeypatch, tmp_path):
    """Issue 34: one ACL table (llmq_core.security). The chart's hook applies it for the release's settings (its
    peers: the regions MirrorMaker 2 mirrors from), as `llmq dev up --secure` does for a stack of the same settings."""
    for name, value in settings_map(values).items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    sources = yaml.safe_load(values.read_text())["mirrorMaker"]["sources"] if values else []
    assert settings.region.peer_regions == tuple(source["region"] for source in sources)
    dev = StackConfig(state_dir=tmp_path, secure=True, peer_regions=settings.region.peer_regions)
    assert set(security.settings_acls(settings)) == set(dev.kafka_acls())
    assert {a.principal for a in dev.kafka_acls()} >= {"api", "batcher", "worker", "router"}


def test_accelerators_only_where_a_model_asks():
    for workers in of_kind(REGION_VALUES[0], "StatefulSet"):
        resources = workers["spec"]["template"]["spec"]["containers"][0]["resources"]
        gpus = {part: resources[part].get("nvidia.com/gpu") for part in ("requests", "limits")}
        simulated = "--engine simulated" in workers["spec"]["template"]["spec"]["containers"][0]["command"][2]
        assert gpus == ({"requests": None, "limits": None} if simulated else {"requests": 1, "limits": 1})


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("kafka.topicReplicationFactor=three", "/kafka/topicReplicationFactor': got string, want integer"),
        ("kafka.securityProtocol=SSL", "/kafka/securityProtocol': value must be one of"),
        ("redis.url=redis.internal:6379", "/redis/url': "),
    ],
)
def test_values_of_the_wrong_shape_fail_before_rendering(setting, message):
    result = template(sets=(setting,))
    assert result.returncode != 0 and message in result.stderr, result.stderr
