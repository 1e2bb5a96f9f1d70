# A Rust build base for docker/Dockerfile's `source` stage with no registry: Debian 13's own
# cargo and rustc (1.85, the workspace's rust-version) on the local Debian base that
# scripts/images.sh makes with debootstrap. The official rust image puts CARGO_HOME in
# /usr/local/cargo; so does this one, so the build stage's cache mount is the same.
ARG DEBIAN_IMAGE=debian:trixie-slim
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends cargo rustc gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV CARGO_HOME=/usr/local/cargo
