# harness-worker/node:20 — for machines with no image registry: the debootstrap base plus the
# host's own Node.js 20+ (its `node` binary and its npm), laid out like the public
# node:20-bookworm-slim image (/usr/local/bin/node, npm under /usr/local/lib/node_modules), so
# docker/harness.Dockerfile builds the same on top of either. scripts/build-images assembles
# the build context (node, npm/) from the host; nothing else from the host goes in.
ARG BASE_IMAGE=harness-worker/base:bookworm
FROM ${BASE_IMAGE}
COPY node /usr/local/bin/node
COPY npm /usr/local/lib/node_modules/npm
RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
    && ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx \
    && node --version >/dev/null && npm --version >/dev/null
