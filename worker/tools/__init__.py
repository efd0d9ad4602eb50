"""Tools for the agent: the run's MCP endpoint and what stands behind it.

:mod:`~worker.tools.endpoint` serves one Unix socket per turn in the run's sandbox (reached
by the stdio bridge :mod:`~worker.tools.bridge` the harness launches as an MCP server),
checks the run's credential on every call, and answers from a tool set served by producer
code through Redis (:mod:`~worker.tools.calls`, :mod:`~worker.tools.schema`) or from an MCP
server the operator names (:mod:`~worker.tools.upstream`). :mod:`~worker.tools.turn` is what
a turn asks of it.
"""
