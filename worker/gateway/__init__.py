"""The model gateway: model keys stay in the worker, and each turn's model requests pass
through it (docs/security.md, "The model gateway")."""
