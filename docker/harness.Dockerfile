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

# The CLIs live outside any HOME (HOME is per run, in the workspace), read-only for the user,
# installed from docker/clis/package.json with its lock file (npm install, not npm ci: see
# scripts/install-clis), as scripts/install-clis does on
# a host. scripts/build-images runs that script on the host (where the registry's TLS setup is
# known to work) and puts the result in the build context as docker/clis/node_modules and
# docker/clis/opencode-home; from a plain checkout neither exists and npm runs here.
# OpenCode installs @opencode-ai/plugin at its own version into $HOME/.config/opencode on every
# start unless it is already there (see scripts/install-clis): it is pre-seeded once, and the
# skeleton HOME below links to that tree, so a new run copies a few bytes, not 60 MB.
COPY docker/clis/ /opt/harness-clis/
RUN set -eu; \
    cd /opt/harness-clis; \
    if [ ! -d node_modules ]; then \
        npm install --no-audit --no-fund; \
    fi; \
    if [ ! -d opencode-home ]; then \
        version="$(node -p 'require("./package.json").dependencies["opencode-ai"]')"; \
        mkdir -p opencode-home/.config/opencode; \
        printf '{\n  "dependencies": {\n    "@opencode-ai/plugin": "%s"\n  }\n}\n' "$version" \
            >opencode-home/.config/opencode/package.json; \
        (cd opencode-home/.config/opencode && npm install --no-audit --no-fund); \
    fi; \
    rm -rf /root/.npm /root/.cache /tmp/*; \
    for cli in claude codex gemini opencode pi; do \
        test -x "node_modules/.bin/$cli" || { echo "missing CLI $cli" >&2; exit 1; }; \
    done; \
    mkdir -p /opt/harness-home/.config/opencode; \
    cp opencode-home/.config/opencode/package*.json /opt/harness-home/.config/opencode/; \
    ln -s /opt/harness-clis/opencode-home/.config/opencode/node_modules \
        /opt/harness-home/.config/opencode/node_modules

# A run's fresh HOME is filled from this skeleton by the sandbox (sandbox/docker/sandbox.py).
LABEL harness.home_skeleton=/opt/harness-home
ENV PATH=/opt/harness-clis/node_modules/.bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
USER 1000:1000
WORKDIR /workspace
CMD ["sleep", "infinity"]
