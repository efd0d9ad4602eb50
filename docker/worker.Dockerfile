# harness-worker/worker:1 — the worker, beat, Flower and the `harness` command, in one image.
#
#     docker build -f docker/worker.Dockerfile -t harness-worker/worker:1 .
#
# The worker starts a container per run through the Docker socket it is given (compose.yaml
# mounts it into the worker service only), so it runs as root here: the socket is root on
# the host anyway, and the worker chowns each run's workspace to the harness user (uid 1000).
# The harness images (harness-worker/clis:1, harness-worker/demo:1) are separate: build them
# on the Docker host the workers use (scripts/build-images, or docker build with
# docker/harness.Dockerfile and docker/demo.Dockerfile).
#
# Only legacy-builder syntax (no heredocs, no --mount): Debian's Docker 20.10 has no BuildKit.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A base without Python (the debootstrap base of scripts/build-images) gets it from Debian.
RUN set -eu; \
    if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
        || { echo "Python 3.11 or newer is needed, found $(python3 --version)" >&2; exit 1; }

# Dependencies first (a layer that survives code changes), then the code.
WORKDIR /opt/harness-worker
COPY pyproject.toml README.md ./
COPY adapters/ adapters/
COPY sandbox/ sandbox/
COPY config/ config/
COPY worker/ worker/
COPY harnesses/ harnesses/
COPY docker/clis/package.json docker/clis/package.json
RUN set -eu; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/pip install --quiet /opt/harness-worker; \
    /opt/venv/bin/harness --help >/dev/null

# Workspaces live under HARNESS_WORKSPACE_ROOT, which must be the same path on the Docker host
# (the daemon bind-mounts a run's workspace from there): compose.yaml mounts it 1:1.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HARNESS_WORKSPACE_ROOT=/var/lib/harness-worker \
    HARNESS_METRICS_PORT=9540
EXPOSE 9540 5555

# Celery's warm shutdown on SIGTERM gives running turns HARNESS_SHUTDOWN_GRACE_S (10 s);
# give the container longer than that to stop (compose.yaml: stop_grace_period).
STOPSIGNAL SIGTERM
CMD ["celery", "-A", "worker.app", "worker", "--loglevel", "info"]
