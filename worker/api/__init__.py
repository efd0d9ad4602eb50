"""The HTTP API (``harness api``): app, routes, streams, tenants, webhooks, run page."""
