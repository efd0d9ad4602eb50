"""Triggers: a forge's or a webhook sender's events, verified by their signature, filtered and
mapped by a template into a run of the trigger's tenant (docs/api.md, "Triggers")."""
