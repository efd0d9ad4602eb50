"""Schedules: runs started on a cron by the workers' own timer (docs/api.md, "Schedules")."""
