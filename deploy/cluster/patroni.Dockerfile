# The cluster profile's PostgreSQL nodes and etcd, from Debian's packages: PostgreSQL 15,
# Patroni 3.0 and etcd 3.4 (the versions `stockade cluster` runs as plain processes).
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 patroni etcd-server curl \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/patroni /var/lib/etcd \
    && chown postgres:postgres /var/lib/postgresql/patroni /var/lib/etcd
COPY patroni.yml post-bootstrap.sh /etc/patroni/
USER postgres
CMD ["patroni", "/etc/patroni/patroni.yml"]
