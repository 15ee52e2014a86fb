# Apache Kafka, the dev stack's broker version, from the Maven Central jars `llmq dev install` assembles (staged by
# `make images` into this build's context as libs/) on Debian's OpenJDK 17. Configured like the apache/kafka image:
# each KAFKA_<NAME> variable is the broker property <name> (lower case, _ -> .); start.sh formats the storage (with the
# llmq roles' SCRAM credentials when their password files are mounted) and starts the broker as user kafka. mirror.sh
# runs MirrorMaker 2 instead (the Helm chart's mirrorMaker), from the connect-mirror jars in mirror-libs/.
ARG BASE=llmq-base:bookworm
FROM ${BASE}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      openjdk-17-jre-headless >/dev/null && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 llmq && useradd --system --uid 10002 --gid 10001 --no-create-home kafka \
 && install -d -o kafka -g llmq -m 0750 /var/lib/kafka
COPY libs /opt/kafka/libs
COPY mirror-libs /opt/kafka/mirror-libs
COPY start.sh mirror.sh log4j2.yaml mirror-log4j2.properties /opt/kafka/
# The dev stack's JVM flags (llmq_cli.kafka_dist.JVM_FLAGS: C1 only, serial GC), passed in by `make images`
ARG JVM_FLAGS=""
ENV KAFKA_LOG_DIRS=/var/lib/kafka/data KAFKA_HEAP_OPTS="-Xmx512m" KAFKA_JVM_FLAGS="${JVM_FLAGS}"
USER kafka
EXPOSE 9092
HEALTHCHECK --interval=10s --timeout=10s --start-period=60s --retries=30 \
  CMD ["bash", "-c", "</dev/tcp/127.0.0.1/${KAFKA_HEALTH_PORT:-9092}"]
ENTRYPOINT ["/bin/bash", "/opt/kafka/start.sh"]
