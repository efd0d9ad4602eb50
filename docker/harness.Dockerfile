# harness-worker/clis:1 — the five harness CLIs (docker/clis/package.json, pinned, installed with
# the lock file) for the Docker sandbox: node 20, bash, git, ca-certificates, procps, a non-root
# user `harness` (uid 1000). Nothing secret is baked in: credentials reach a turn's exec only.
#
# With a registry (public base image):
#     docker build -f docker/harness.Dockerfile -t harness-worker/clis:1 .
# Without one: scripts/build-images --only clis, which builds the same file on
# harness-worker/node:20 (the debootstrap base plus the host's node) with --network host.
#
# Only legacy-builder syntax here (no heredocs, no COPY --chmod): Debian's Docker 20.10 has
# no BuildKit client.
ARG BASE_IMAGE=node:20-bookworm-slim
FROM ${BASE_IMAGE}

# Installs only what the base lacks (the debootstrap base has all of it, so no apt there).
RUN set -eu; missing=""; \
    for pair in bash:bash git:git ps:procps tini:tini; do \
        command -v "${pair%%:*}" >/dev/null || missing="$missing ${pair#*:}"; \
    done; \
    [ -f /etc/ssl/certs/ca-certificates.crt ] || missing="$missing ca-certificates"; \
    if [ -n "$missing" ]; then \
        apt-get update && apt-get install -y --no-install-recommends $missing \
        && rm -rf /var/lib/apt/lists/*; \
    fi; \
    node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' \
        || { echo "node 20 or newer is needed, found $(node --version)" >&2; exit 1; }

# The harness user is uid 1000 (RunSpec.user "1000:1000"). The node images already have uid
# 1000 ("node"): it is renamed.
RUN set -eu; \
    existing="$(getent passwd 1000 | cut -d: -f1)"; \
    if [ -n "$existing" ]; then \
        [ "$existing" = harness ] || usermod --login harness --home /home/harness --move-home "$existing"; \
        group="$(getent group 1000 | cut -d: -f1)"; \
        [ -z "$group" ] || [ "$group" = harness ] || groupmod --new-name harness "$group"; \
    else \
        groupadd --gid 1000 harness; \
        useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash harness; \
    fi; \
    mkdir -p /workspace && chown 1000:1000 /workspace

# The CLIs live outside any HOME (HOME is per run, in the workspace), read-only for the user.
# scripts/install-clis is the one place that knows how to install them and how to pre-seed
# OpenCode's per-HOME package tree, so the image uses it as the host does.
COPY docker/clis/ /opt/harness-clis/src/docker/clis/
COPY scripts/install-clis /opt/harness-clis/src/scripts/install-clis
RUN set -eu; \
    cd /opt/harness-clis; \
    HOME=/root src/scripts/install-clis /opt/harness-clis >/dev/null; \
    HOME=/root src/scripts/install-clis --seed-opencode /opt/harness-home; \
    if [ -d /opt/harness-home/.config/opencode/node_modules ]; then \
        mv /opt/harness-home/.config/opencode/node_modules /opt/harness-clis/opencode-plugin; \
        ln -s /opt/harness-clis/opencode-plugin /opt/harness-home/.config/opencode/node_modules; \
    fi; \
    rm -rf /root/.npm /root/.cache /tmp/*; \
    chmod -R a+rX /opt/harness-clis /opt/harness-home; \
    for cli in claude codex gemini opencode pi; do \
        test -x "/opt/harness-clis/node_modules/.bin/$cli" || { echo "missing CLI $cli" >&2; exit 1; }; \
    done

# A run's fresh HOME is filled from this skeleton by the sandbox (sandbox/docker.py). The
# OpenCode plugin tree itself stays in the image, linked, so a run copies a few bytes, not 60 MB.
LABEL harness.home_skeleton=/opt/harness-home
ENV PATH=/opt/harness-clis/node_modules/.bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
USER 1000:1000
WORKDIR /workspace
CMD ["sleep", "infinity"]
