"""docker-compose.yml and the images' build checked statically: services, images, ports, environment, commands (the
stack itself runs in `make compose-test`, tests/compose)."""

import os
import subprocess
import tomllib
from pathlib import Path

import yaml

from llmq_cli.kafka_dist import KAFKA_VERSION

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
BUILD = (ROOT / "deploy" / "images" / "build.sh").read_text()


LLMQ_SERVICES = [name for name, svc in SERVICES.items() if name not in ("kafka", "redis", "loadgen")]
ROLE_OF = {"api-0": "api", "api-1": "api", "batcher": "batcher", "result-router": "router", "topics": "admin"}


def test_every_image_is_a_local_build_tagged_with_its_version_and_never_pulled():
    assert SERVICES["kafka"]["image"] == f"llmq-kafka:{KAFKA_VERSION}"  # the dev stack's broker version
    assert SERVICES["redis"]["image"].startswith("llmq-redis:7.")
    for name in LLMQ_SERVICES + ["loadgen"]:
        assert SERVICES[name]["image"] in (f"llmq:{VERSION}", f"llmq-worker:{VERSION}"), name
    for name, svc in SERVICES.items():
        assert svc["pull_policy"] == "never" and "build" not in svc, name  # `make images` builds them
    for image in ("llmq-kafka:$KAFKA_VERSION", "llmq:$VERSION", "llmq-worker:$VERSION", "llmq-redis:$redis_version"):
        assert image in BUILD, image


def test_the_torch_workers_run_the_worker_image_and_the_others_the_light_one():
    worker_build = next(line for line in BUILD.splitlines() if '"llmq-worker:$VERSION"' in line and "build " in line)
    assert "--build-arg EXTRAS=worker --build-arg MODELS=models" in worker_build
    for name in LLMQ_SERVICES:
        torch = "--engine" in SERVICES[name].get("command", []) and "transformers" in SERVICES[name]["command"]
        assert SERVICES[name]["image"] == (f"llmq-worker:{VERSION}" if torch else f"llmq:{VERSION}"), name


def _published(ports: list[str]) -> list[str]:
    """The host ports of ``ports`` not bound to loopback."""
    return [p for p in ports if not str(p).startswith(("127.0.0.1:", "[::1]:"))]


def test_nothing_is_published_beyond_loopback_and_kafka_and_redis_not_at_all():
    for name, svc in SERVICES.items():
        assert _published(svc.get("ports", [])) == [], name
    for name in ("kafka", "redis"):
        assert SERVICES[name].get("ports", []) == [], name


def test_kafka_has_no_plaintext_listener_authorizes_and_never_auto_creates_topics():
    env = SERVICES["kafka"]["environment"]
    protocols = dict(pair.split(":") for pair in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = [entry.split("://")[0] for entry in env["KAFKA_LISTENERS"].split(",")]
    assert "PLAINTEXT" not in protocols.values() and "PLAINTEXT" not in listeners
    assert {protocols[name] for name in listeners} <= {"SASL_SSL", "SSL"}
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert "ScramLoginModule" in env["KAFKA_LISTENER_NAME_SASL__SSL_SCRAM___SHA___512_SASL_JAAS_CONFIG"]
    start = (ROOT / "deploy" / "images" / "kafka-start.sh").read_text()
    assert "--add-scram" in start and "SCRAM-SHA-512" in start
    assert all(f"{role}.password" in SERVICES["kafka"]["secrets"] for role in ("api", "batcher", "worker", "router"))


def test_the_kafka_image_reads_the_compose_environment_as_broker_properties(tmp_path):
    env = {key: str(value) for key, value in SERVICES["kafka"]["environment"].items()}
    env |= {"PATH": os.environ["PATH"], "KAFKA_PROPERTIES_FILE": str(tmp_path / "server.properties")}
    start = ROOT / "deploy" / "images" / "kafka-start.sh"
    done = subprocess.run(["bash", str(start), "--properties"], env=env, capture_output=True, text=True, check=True)
    properties = dict(line.split("=", 1) for line in done.stdout.splitlines())
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    assert properties["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"] == jaas
    assert properties["listener.name.broker.ssl.client.auth"] == "required"
    assert properties["super.users"] == "User:admin;User:CN=llmq-broker"
    assert properties["node.id"] == "1" and "cluster.id" not in properties and "heap.opts" not in properties


def test_redis_speaks_only_tls_with_acl_users():
    command = SERVICES["redis"]["command"]
    assert command[command.index("--port") + 1] == "0"  # no plaintext port
    assert "--tls-port" in command and "--aclfile" in command


def test_every_llmq_service_runs_secure_as_its_own_role():
    for name in LLMQ_SERVICES:
        env = SERVICES[name]["environment"]
        role = ROLE_OF.get(name, "worker")
        assert env["LLMQ_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", name
        assert env["LLMQ_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", name
        assert env["LLMQ_KAFKA_SASL_USERNAME"] == env["LLMQ_REDIS_USERNAME"] == role, name
        assert env["LLMQ_KAFKA_SASL_PASSWORD_FILE"] == f"/run/secrets/{role}.password", name
        assert env["LLMQ_REDIS_URL"].startswith("rediss://"), name
        assert f"{role}.password" in SERVICES[name]["secrets"], name
        assert env["LLMQ_KAFKA_SSL_CAFILE"] == env["LLMQ_REDIS_SSL_CAFILE"] == "/run/secrets/ca.pem", name


def test_api_pods_take_keys_from_a_file_without_the_public_dev_keys_and_hide_metrics():
    for name in ("api-0", "api-1"):
        env = SERVICES[name]["environment"]
        assert env["LLMQ_API_DEV_KEYS"] == "false"
        assert (
            env["LLMQ_API_KEYS_FILE"] == "/run/secrets/api-keys.yaml" and "api-keys.yaml" in SERVICES[name]["secrets"]
        )
        metrics_port = str(env["LLMQ_METRICS_PORT"])
        assert not any(str(p).endswith(f":{metrics_port}") for p in SERVICES[name]["ports"]), name
    assert COMPOSE["secrets"]["api-keys.yaml"]["file"].startswith("./deploy/secrets/")
    assert "/deploy/secrets/" in (ROOT / ".gitignore").read_text()


def test_every_image_runs_as_a_non_root_user_with_a_health_check():
    for dockerfile in (ROOT / "Dockerfile", *(ROOT / "deploy" / "images").glob("*.Dockerfile")):
        lines = dockerfile.read_text().splitlines()
        users = [line.split()[1] for line in lines if line.startswith("USER ")]
        assert users and users[-1] not in ("root", "0"), dockerfile
        assert any(line.startswith("HEALTHCHECK ") for line in lines), dockerfile


def test_the_topics_job_creates_every_roles_acls_first():
    assert SERVICES["topics"]["command"] == ["llmq", "topics", "--acls"]


def test_every_llmq_service_is_composed_with_its_module():
    modules = {name: " ".join(svc.get("command", [])) for name, svc in SERVICES.items()}
    assert "llmq_api.main" in modules["api-0"] and "llmq_api.main" in modules["api-1"]
    assert "llmq_batcher.main" in modules["batcher"]
    assert "llmq_result_router.main" in modules["result-router"]
    workers = [name for name, cmd in modules.items() if "llmq_worker.main" in cmd]
    assert {"worker-tiny-0", "worker-sim-0", "worker-sim-1"} <= set(workers)
    partitions = [SERVICES[w]["command"][SERVICES[w]["command"].index("--partition") + 1] for w in workers]
    assert len(set(partitions)) == len(partitions), "two workers would share one partition of llmq.batches"


def test_api_pods_publish_distinct_ports_and_instance_ids():
    ports = [SERVICES[f"api-{i}"]["ports"][0] for i in range(2)]
    assert ports == [
        "127.0.0.1:${LLMQ_COMPOSE_API_0_PORT:-8000}:8000",
        "127.0.0.1:${LLMQ_COMPOSE_API_1_PORT:-8001}:8001",
    ]
    ids = [SERVICES[f"api-{i}"]["command"][-1] for i in range(2)]
    assert len(set(ids)) == 2


def test_services_reach_kafka_and_redis_by_service_name():
    for name, svc in SERVICES.items():
        if name in ("kafka", "redis"):
            continue
        env = svc["environment"]
        assert env["LLMQ_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092", name
        assert env["LLMQ_REDIS_URL"].startswith("rediss://redis:6379"), name


def test_modules_in_compose_exist_in_the_tree():
    for name, svc in SERVICES.items():
        command = svc.get("command", [])
        if "-m" in command:
            module = command[command.index("-m") + 1].split(".")[0]
            assert list(ROOT.glob(f"services/*/{module}/__init__.py")), f"{name} runs missing module {module}"


def test_worker_images_carry_the_converted_checkpoints_made_by_the_install_step():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY build/images/${MODELS} /opt/llmq/models" in dockerfile
    assert "LLMQ_MODELS_DIR=/opt/llmq/models" in dockerfile
    assert "from llmq_worker.checkpoints import models_root" in BUILD  # where `make models` converted them
    real = SERVICES["worker-smollm2-0"]
    assert real["command"][real["command"].index("--model") + 1] == "smollm2-135m-instruct"


def test_the_package_layers_come_before_the_code_so_a_code_change_keeps_torch():
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    install = next(i for i, line in enumerate(lines) if "uv pip install --quiet -r /tmp/requirements.txt" in line)
    code = min(i for i, line in enumerate(lines) if line.startswith(("COPY libs", "COPY services", "COPY cli")))
    assert install < code
    ignore = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if not line.startswith("#")]
    assert ignore[0] == "*" and "!.venv" not in ignore  # the context: an allow list, never .venv or var/


def test_loadgen_runs_llmq_bench_against_both_pods_under_the_load_profile():
    import click
    import typer

    from llmq_cli.main import app

    loadgen = SERVICES["loadgen"]
    assert loadgen["profiles"] == ["load"]
    assert loadgen["image"] == SERVICES["api-0"]["image"] == f"llmq:{VERSION}"
    argv = loadgen["entrypoint"] + loadgen["command"]
    assert argv[:2] == ["llmq", "bench"]
    urls = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--base-url"]
    assert urls == ["http://api-0:8000/v1", "http://api-1:8001/v1"]
    assert {"api-0", "api-1"} <= set(loadgen["depends_on"])
    group = typer.main.get_command(app)
    bench = group.get_command(click.Context(group), "bench")
    known = {opt for param in bench.params for opt in param.opts}
    assert {arg for arg in argv if arg.startswith("--")} <= known


def test_api_pods_and_result_router_share_the_batch_file_store():
    for name in ("api-0", "api-1", "result-router"):
        assert "llmq-files:/data/files" in SERVICES[name]["volumes"], name
        assert SERVICES[name]["environment"]["LLMQ_FILES_URL"] == "/data/files"
    assert "llmq-files" in COMPOSE["volumes"]


def test_redis_has_a_memory_budget_and_evicts_only_keys_with_a_ttl():
    command = SERVICES["redis"]["command"]
    assert command[command.index("--maxmemory-policy") + 1] == "volatile-lru"
    assert command[command.index("--maxmemory") + 1] == "${LLMQ_DEV_REDIS_MAXMEMORY_BYTES:-536870912}"


def test_batchers_and_routers_scale_each_replica_with_its_own_instance_id():
    # `docker compose up --scale batcher=3`: a fixed --instance-id would give every replica the same id; without one
    # each takes its container's hostname and pid (runtime.service_arguments)
    for name in ("batcher", "result-router"):
        assert "--instance-id" not in SERVICES[name]["command"], name
        assert "container_name" not in SERVICES[name], name


def test_the_helm_chart_runs_the_images_compose_runs():
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "llmq" / "values.yaml").read_text())
    chart = {f"{values[key]['repository']}:{values[key]['tag']}" for key in ("image", "workerImage")}
    assert chart == {SERVICES["api-0"]["image"], SERVICES["worker-smollm2-0"]["image"]}
