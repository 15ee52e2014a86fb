# Redis from Debian's redis-server (7.0, linked against OpenSSL: TLS works), run as Debian's redis user, which is also
# in group llmq (gid 10001: the group `make compose-secrets` gives the mounted secrets).
ARG BASE=llmq-base:bookworm
FROM ${BASE}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      redis-server >/dev/null && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 llmq && usermod -a -G llmq redis \
 && install -d -o redis -g redis -m 0750 /data
WORKDIR /data
USER redis
EXPOSE 6379
HEALTHCHECK --interval=10s --timeout=10s --retries=30 CMD ["bash", "-c", "</dev/tcp/127.0.0.1/${REDIS_HEALTH_PORT:-6379}"]
CMD ["redis-server", "--protected-mode", "no"]
