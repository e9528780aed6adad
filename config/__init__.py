"""Settings: one validated pydantic-settings tree (env prefix BATCHSCOPE_, nested delimiter __)."""

from config.settings import Settings, SettingsError, load_settings

__all__ = ["Settings", "SettingsError", "load_settings"]
