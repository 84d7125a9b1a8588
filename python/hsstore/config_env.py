"""The ``HSS_*`` environment variables the Python package reads, read here and nowhere else (as
src/config/config_env.cpp is the native library's one reader: docs/design.md, "Layers").
tests/layers/env_reads_test.py checks that no other file of the package or of src/ reads one.

``HSS_LOG_LEVEL``: the native library's log threshold (src/base/log.hpp), which hsstore.vllm's
Python logger follows too (``debug``, ``info``, ``warning``, ``error``, ``off``; ``info`` unset).
"""

from __future__ import annotations

import os

__all__ = ["LOG_LEVEL", "log_level"]

LOG_LEVEL = "HSS_LOG_LEVEL"


def log_level(default: str = "info") -> str:
    """HSS_LOG_LEVEL as set, lower-cased, else `default`."""
    return os.environ.get(LOG_LEVEL, default).lower()
