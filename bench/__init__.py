"""Benchmarks against the physical limits (issue 8): ``python -m bench [--quick] [--only ROW]``.
(The package also holds the load and soak commands, ``bench.scale_load`` and ``bench.soak``.)

Each row runs our path and the raw cost of the same work in the same run, and prints both
with their ratio. Benchmarks print figures; they never assert times. ``tests/bench`` runs
every row with tiny sizes through the same code and checks only correctness (every event
present, in order; an oversized line counted).
"""
