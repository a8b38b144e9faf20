# PostgreSQL from Debian's packages on the stack's base image, for machines that reach no
# image registry. Same interface as the official image where the stack uses it:
# POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, data in /var/lib/postgresql/data, port 5432.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
# No cluster at install time: the entrypoint makes one in the volume on first start.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
 && echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.d/no-main.conf \
 && apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data \
 && install -d -o postgres -g postgres -m 0775 /var/run/postgresql
COPY docker/postgres-entrypoint /usr/local/bin/
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["postgres-entrypoint"]
