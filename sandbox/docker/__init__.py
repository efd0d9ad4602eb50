"""The Docker backend: one hardened container per run (:mod:`.sandbox`, :mod:`.container`),
turns as execs over our own stream (:mod:`.execs`, :mod:`.stream`, :mod:`.scripts`), a warm
pool (:mod:`.warm_pool`), remembered placements (:mod:`.placements`) and the egress gateway
(:mod:`.egress`, :mod:`.gateway`)."""
