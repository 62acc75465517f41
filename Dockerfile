# The control plane's own image. Build it with `make image`
# (scripts/build-control-plane-image.sh), which downloads the wheels on the host
# first; nothing in this build talks to PyPI. Run it as docs/deployment.md shows:
# host network, the host's Docker socket, ACS_REDIS_URL.
#
# Build context: the repository root, filtered by .dockerignore down to the
# project's source, the spec YAML files, specs/images/common/ensure-packages.sh
# and the wheel directory. Needs nothing beyond the legacy builder (no heredocs,
# no cache mounts). Builds on the local debootstrapped acs-base:bookworm (no
# network needed) and on a registry debian:bookworm-slim (python3 is then
# installed with apt).
ARG BASE_IMAGE=debian:bookworm-slim

# --- what the control plane needs at run time: python3 and CA certificates
FROM ${BASE_IMAGE} AS runtime
ENV LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY specs/images/common/ensure-packages.sh /usr/local/lib/acs/ensure-packages.sh
RUN sh /usr/local/lib/acs/ensure-packages.sh python3 ca-certificates

# --- the venv, built from host-downloaded wheels that never reach the final image
FROM runtime AS venv
RUN sh /usr/local/lib/acs/ensure-packages.sh python3-venv \
    && python3 -m venv /opt/acs/venv
ARG WHEELS=var/build/control-plane/wheels
COPY ${WHEELS}/ /tmp/wheels/
# Dependencies first: this layer is rebuilt only when the wheels change.
RUN /opt/acs/venv/bin/pip install --quiet --no-cache-dir --disable-pip-version-check \
        --no-index --find-links /tmp/wheels \
        -r /tmp/wheels/requirements.txt -c /tmp/wheels/constraints.txt
COPY pyproject.toml /tmp/src/
COPY controlplane/ /tmp/src/controlplane/
COPY drivers/ /tmp/src/drivers/
COPY agent/ /tmp/src/agent/
# The project itself (setuptools comes from /tmp/wheels); then pip and setuptools,
# which nothing needs at run time, leave the venv.
RUN /opt/acs/venv/bin/pip install --quiet --no-cache-dir --disable-pip-version-check \
        --no-index --find-links /tmp/wheels --no-deps /tmp/src \
    && /opt/acs/venv/bin/pip uninstall --quiet --yes pip setuptools \
    && /opt/acs/venv/bin/controlplane --help >/dev/null
# The build script tags this stage (acs-control-plane-build:venv) to keep it as the layer cache
# and prunes its older, untagged versions by this label.
LABEL acs.image=control-plane-venv

# --- the control plane
FROM runtime
LABEL acs.image=control-plane \
      org.opencontainers.image.title="Agent Conversation Service control plane" \
      org.opencontainers.image.description="Run with --network host, the host's Docker socket and ACS_REDIS_URL (docs/deployment.md)"
# A fixed uid, so that volumes and the socket's group can be set up for it on the host.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/acs --no-create-home \
        --shell /usr/sbin/nologin acs \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/acs
COPY --from=venv /opt/acs/venv /opt/acs/venv
# Only the spec YAML files: the sandbox images they name are built on the Docker host
# (`make images`), and the control plane only starts containers from them.
COPY specs/*.y*ml /opt/acs/specs/
# ACS_REDIS_URL has no usable default here: the embedded default needs redis-server,
# which this image does not ship. ACS_DATA_DIR holds the secret key file
# (secret.key): keep it on a volume, or set ACS_SECRET_KEY.
ENV PATH=/opt/acs/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    ACS_SPEC_DIR=/opt/acs/specs \
    ACS_DATA_DIR=/var/lib/acs
WORKDIR /var/lib/acs
USER 10001:10001
EXPOSE 3000
# GET /health on the address and port `serve` was given (read from PID 1's command
# line, which is `controlplane serve ...`, or docker-init's with --init), no proxy.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import argparse, urllib.request as u\np = argparse.ArgumentParser()\np.add_argument('--host', default='127.0.0.1')\np.add_argument('--port', default='3000')\nargv = open('/proc/1/cmdline').read().split('\\0')\na, _ = p.parse_known_args([x for x in argv[1:] if x != '--'])\nh = {'0.0.0.0': '127.0.0.1', '::': '::1', '': '127.0.0.1'}.get(a.host, a.host)\nh = f'[{h}]' if ':' in h else h\nu.build_opener(u.ProxyHandler({})).open(f'http://{h}:{a.port}/health', timeout=4)"]
# `controlplane` is PID 1 and handles SIGTERM itself: it finishes in-flight requests (up to
# 30 s; an open event WebSocket up to twice that), so give `docker stop` more than its
# default 10 s (`--stop-timeout 70`, docs/deployment.md).
STOPSIGNAL SIGTERM
ENTRYPOINT ["controlplane"]
# Loopback by default: with --network host, 0.0.0.0 would expose the API on every interface.
# serve also binds the Docker bridge gateway, where sandboxes post their webhooks.
CMD ["serve", "--host", "127.0.0.1", "--port", "3000"]
