"""Where a harness command runs: the boundary and its whole error tree (:mod:`sandbox.base`),
the local backend (:mod:`sandbox.local`), the Docker backend with its egress gateway
(:mod:`sandbox.docker`) and the workspace store that no backend owns (:mod:`sandbox.store`).
"""
