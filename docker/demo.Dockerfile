# harness-worker/demo:1 — the stdio-json demo harness (harnesses/demo.py) in a small image.
#
# With a registry:    docker build -f docker/demo.Dockerfile -t harness-worker/demo:1 .
# Without a registry: scripts/build-images --only demo (builds on the debootstrap base, which
#                     already has python3, so nothing below needs the network).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

# Installs only what the base lacks: the debootstrap base has all of it.
RUN set -eu; missing=""; \
    command -v python3 >/dev/null || missing="$missing python3"; \
    command -v ps >/dev/null || missing="$missing procps"; \
    if [ -n "$missing" ]; then \
        apt-get update && apt-get install -y --no-install-recommends $missing \
        && rm -rf /var/lib/apt/lists/*; \
    fi

# The harness runs as uid 1000 (RunSpec.user "1000:1000"); its HOME is set per run inside the
# workspace, the home below only serves a user who runs the image by hand.
RUN set -eu; \
    groupadd --gid 1000 harness; \
    useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash harness; \
    mkdir -p /workspace && chown 1000:1000 /workspace

COPY harnesses/demo.py /usr/local/bin/harness-demo
RUN chmod 0755 /usr/local/bin/harness-demo

ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 1000:1000
WORKDIR /workspace
CMD ["sleep", "infinity"]
