#!/usr/bin/env bash
# Assembles an Apache Kafka broker (KRaft) from Maven Central jars into a cache outside the clone.
# Idempotent: does nothing when the jars are already there. Usage: scripts/install-kafka.sh [VERSION]
set -euo pipefail
version="${1:-${LLMQ_KAFKA_VERSION:-4.1.2}}"
dest="${LLMQ_CACHE_DIR:-$HOME/.cache/llmq}/kafka-$version-r2"
if [ -f "$dest/.complete" ]; then exit 0; fi
command -v mvn >/dev/null || { echo "install-kafka: mvn is required (apt-get install maven)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.llmq</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$version</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
POM
echo "install-kafka: resolving Apache Kafka $version from Maven Central into $dest" >&2
mkdir -p "$dest/libs"
mvn -B -q -f "$work/pom.xml" org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
  -DoutputDirectory="$dest/libs" -DincludeScope=runtime
touch "$dest/.complete"
echo "install-kafka: done ($(ls "$dest/libs" | wc -l) jars)" >&2
