# hoard's container image: `scripts/image` builds it (with buildah, podman or docker).
#
# The image holds nothing but what hoard needs: the server binary and the shared libraries it
# loads, the CA certificates its TLS clients use (S3, GCS, Azure, token-key discovery), a
# passwd entry for its unprivileged user and /data. No shell, no package manager.
#
# scripts/image builds the binary on the host and lays these files out in target/image/, which
# is the only part of the repository the build context holds (.dockerignore); the image
# is then built FROM scratch, so building it pulls nothing from a registry. To build with
# another tool by hand: `scripts/image --rootfs-only`, then `docker build -t hoard .`.
#
# Run it with a volume on /data (the SQLite database, the chunks and the signing key of a
# single server) and a read-only root:
#
#   podman run -d --read-only -p 3000:3000 -v hoard-data:/data hoard:VERSION
#
# Configure it with HOARD_* variables (`podman run --rm hoard:VERSION serve --help` lists them).
# For replicas on PostgreSQL and object storage, see docs/scale-out.md and contrib/scale-out/.

FROM scratch

# scripts/image passes the version from Cargo.toml, the git commit and the repository's address.
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="hoard" \
      org.opencontainers.image.description="A self-hosted cache server for GitHub Actions" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="MIT"

# Owned by root and read-only to hoard.
COPY target/image/rootfs/ /
# The data directory, hoard's own (a volume mounted there takes its owner on first use).
COPY --chown=10001:10001 target/image/owned/ /

ENV HOARD_LISTEN=0.0.0.0:3000 \
    HOARD_DATA_DIR=/data \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
WORKDIR /data
USER 10001:10001
EXPOSE 3000
VOLUME ["/data"]

# Asks /readyz on 127.0.0.1 at the port of HOARD_LISTEN; no shell needed. (Kept by Docker and
# Podman with the docker image format, which scripts/image builds; Kubernetes uses its probes.)
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/hoard", "health"]

ENTRYPOINT ["/usr/local/bin/hoard"]
CMD ["serve"]
