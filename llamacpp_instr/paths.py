"""Where things live: the repo's patches and the cache outside the repo."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES_DIR = REPO_ROOT / "patches"


def cache_dir() -> Path:
    """Cache for the sdist, build trees and built wheels (``LLAMACPP_INSTR_CACHE`` overrides)."""
    env = os.environ.get("LLAMACPP_INSTR_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llamacpp-instr"
