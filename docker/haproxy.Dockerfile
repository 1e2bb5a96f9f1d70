# HAProxy from Debian 13's haproxy package (3.0), as an image that behaves like the official
# `haproxy` image the spoa chart's sidecar mode defaults to: the configuration at
# /usr/local/etc/haproxy/haproxy.cfg, master-worker in the foreground (-W -db), STOPSIGNAL
# SIGUSR1 (soft stop), a non-root user. The sidecar pod tests run it (tests/cri); build it
# with `bash scripts/images.sh --haproxy`.
ARG DEBIAN_IMAGE=debian:trixie-slim
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /usr/local/etc/haproxy
USER haproxy
WORKDIR /var/lib/haproxy
EXPOSE 80/tcp
STOPSIGNAL SIGUSR1
ENTRYPOINT ["/usr/sbin/haproxy", "-W", "-db"]
CMD ["-f", "/usr/local/etc/haproxy/haproxy.cfg"]
