# syntax=docker/dockerfile:1
#
# hoard in a container: `docker build -t hoard .` from the repository root.
# The image runs `hoard serve` as an unprivileged user (uid 10001) and listens on port 3000.
# Configure it with HOARD_* variables (`docker run --rm hoard serve --help` lists them).
# For several replicas on PostgreSQL and object storage, see docs/scale-out.md and
# contrib/scale-out/.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# The caches keep downloaded crates and build output between builds of this image; the binary
# is copied out of the cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && cp target/release/hoard /usr/local/bin/hoard

FROM debian:bookworm-slim
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 hoard \
    && useradd --system --uid 10001 --gid hoard --home-dir /var/lib/hoard --shell /usr/sbin/nologin hoard \
    && install -d -o hoard -g hoard -m 0750 /var/lib/hoard
COPY --from=build /usr/local/bin/hoard /usr/local/bin/hoard
# The data directory holds the SQLite database, the chunks and the signing key of a single
# server. Mount a volume there for that. Replicas on PostgreSQL and object storage, with
# HOARD_SIGNING_KEY set, write nothing to it.
ENV HOARD_LISTEN=0.0.0.0:3000 \
    HOARD_DATA_DIR=/var/lib/hoard
WORKDIR /var/lib/hoard
USER 10001:10001
EXPOSE 3000
ENTRYPOINT ["hoard"]
CMD ["serve"]
