"""The loader's one error, apart so that every part of model/ can raise it without importing the loader."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message is one line that says which setting to change."""
