# Redis from Debian's packages on the stack's base image, for machines that reach no image
# registry. Data in /data (the compose file turns the append-only file on).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o redis -g redis -m 0750 /data
USER redis
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--dir", "/data"]
