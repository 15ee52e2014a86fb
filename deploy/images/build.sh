#!/usr/bin/env bash
# `make images`: every image the compose stack runs, built from the package registries alone (Debian's packages, PyPI,
# Maven Central), never pulled from an image registry. Idempotent: the base image is made once; the others are BuildKit
# builds whose cached layers make a rerun take seconds (a code change rebuilds only the project's own layer).
#   llmq-base:bookworm, llmq-base:<debian version>   debootstrap --variant=minbase bookworm, then docker import
#   llmq-kafka:<kafka version>                       the jars `llmq dev install` assembled (~/.cache/llmq) on OpenJDK 17:
#                                                    the broker, and MirrorMaker 2 (/opt/kafka/mirror.sh)
#   llmq-redis:<major.minor>, :<version>             Debian's redis-server
#   llmq:<project version>, llmq-worker:<version>    the Dockerfile (uv.lock's versions; the worker one with torch and
#                                                    the checkpoints `make setup` converted into ~/.cache/llmq/models)
# Builds use host networking: an engine started with --ip-masq=false gives build containers no route out.
set -euo pipefail
cd "$(dirname "$0")/../.."
export DOCKER_BUILDKIT=1
PY=.venv/bin/python
VERSION=$($PY -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
KAFKA_VERSION=$($PY -c 'from llmq_cli.kafka_dist import KAFKA_VERSION; print(KAFKA_VERSION)')
KAFKA_LIBS=$($PY -c 'from llmq_cli.kafka_dist import libs_dir; print(libs_dir())')
MIRROR_LIBS=$($PY -c 'from llmq_cli.kafka_dist import mirror_libs_dir; print(mirror_libs_dir())')
MODELS=$($PY -c 'from llmq_worker.checkpoints import models_root; print(models_root())')
STAGE=build/images
BASE=llmq-base:bookworm
# BuildKit: a docker CLI with buildx, or one older than 23 (BuildKit inside the client, e.g. Debian's docker.io 20.10)
builder=""
for cli in docker /usr/bin/docker; do
  if $cli buildx version >/dev/null 2>&1 || [ "$($cli version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)" -lt 23 ] 2>/dev/null; then
    builder=$cli && break
  fi
done
[ -n "$builder" ] || { echo "images: needs BuildKit: the buildx plugin, or Debian's docker.io client"; exit 1; }
# The host's trust store, for the build steps that reach PyPI (a build secret: no image keeps it)
CA=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
build() { $builder build --network host --secret "id=ca,src=$CA" --quiet "$@" >/dev/null; }
link() { rm -rf "$2" && mkdir -p "$(dirname "$2")" && { cp -al "$1" "$2" 2>/dev/null || cp -a "$1" "$2"; }; }
took() { echo "  $1: $(($(date +%s) - start)) s, $(docker image inspect --format '{{.Size}}' "$1" | numfmt --to=si)"; }

start=$(date +%s)
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { echo "images: needs debootstrap (apt-get install debootstrap) and root"; exit 1; }
  root=$(mktemp -d)
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=ca-certificates bookworm "$root/fs" >"$root/log" 2>&1 \
    || { tail -20 "$root/log"; exit 1; }
  rm -rf "$root"/fs/var/cache/apt/archives/*.deb "$root"/fs/var/lib/apt/lists/*
  tar -C "$root/fs" -c . | docker import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  docker tag "$BASE" "llmq-base:$(cat "$root/fs/etc/debian_version")"
fi
took "$BASE"

start=$(date +%s)
link "$KAFKA_LIBS" "$STAGE/kafka/libs"
link "$MIRROR_LIBS" "$STAGE/kafka/mirror-libs"
cp deploy/images/kafka-start.sh "$STAGE/kafka/start.sh"
install -m 0755 deploy/images/kafka-mirror.sh "$STAGE/kafka/mirror.sh"
$PY -c 'from llmq_cli.kafka_dist import LOG4J2_YAML; print(LOG4J2_YAML, end="")' >"$STAGE/kafka/log4j2.yaml"
$PY -c 'from llmq_cli.kafka_dist import MIRROR_LOG4J2_PROPERTIES as P; print(P, end="")' \
  >"$STAGE/kafka/mirror-log4j2.properties"
JVM_FLAGS=$($PY -c 'from llmq_cli.kafka_dist import JVM_FLAGS; print(" ".join(JVM_FLAGS))')
build -f deploy/images/kafka.Dockerfile --build-arg "JVM_FLAGS=$JVM_FLAGS" -t "llmq-kafka:$KAFKA_VERSION" "$STAGE/kafka"
took "llmq-kafka:$KAFKA_VERSION"

start=$(date +%s)
mkdir -p "$STAGE/redis"
build -f deploy/images/redis.Dockerfile -t llmq-redis:build "$STAGE/redis"
redis_version=$(docker run --rm llmq-redis:build redis-server --version | sed -n 's/.* v=\([0-9.]*\) .*/\1/p')
docker tag llmq-redis:build "llmq-redis:$redis_version"
docker tag llmq-redis:build "llmq-redis:${redis_version%.*}"
docker rmi llmq-redis:build >/dev/null
took "llmq-redis:$redis_version"

# The model files, hard links into the build context where the file system allows (the context is the repository);
# a file only its owner may read is copied instead and made readable (the services run as user llmq)
link "$MODELS" "$STAGE/models"
find "$STAGE/models" -type f ! -perm -o=r -exec sh -c 'cp -p "$1" "$1.tmp" && mv "$1.tmp" "$1" && chmod a+r "$1"' _ {} \;
rm -rf "$STAGE/tokenizers"
for dir in "$STAGE"/models/*/; do
  mkdir -p "$STAGE/tokenizers/$(basename "$dir")"
  cp -p "$dir"tokenizer* "$dir"chat_template* "$STAGE/tokenizers/$(basename "$dir")/" 2>/dev/null || true
done
start=$(date +%s)
build -t "llmq:$VERSION" -t llmq:latest .
took "llmq:$VERSION"
start=$(date +%s)
build -t "llmq-worker:$VERSION" -t llmq-worker:latest --build-arg EXTRAS=worker --build-arg MODELS=models .
took "llmq-worker:$VERSION"
