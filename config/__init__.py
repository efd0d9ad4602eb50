"""Typed settings (pydantic-settings, prefix ``HARNESS_``) and per-harness defaults."""

from config.settings import Settings, SettingsError, get_settings, load_settings

__all__ = ["Settings", "SettingsError", "get_settings", "load_settings"]
