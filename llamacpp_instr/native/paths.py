"""Where things live: the patches (in the checkout, or shipped in the package) and the cache."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # llamacpp_instr/, above native/
REPO_ROOT = PACKAGE_DIR.parent


def _patches_dir() -> Path:
    # A checkout (editable install) has patches/ beside the package; a wheel ships the same files
    # as llamacpp_instr/patches (see pyproject.toml), so `instr build` and `instr doctor` work there.
    checkout = REPO_ROOT / "patches"
    if (checkout / "series").is_file():
        return checkout
    return PACKAGE_DIR / "patches"


PATCHES_DIR = _patches_dir()
OVERLAY_DIR = PATCHES_DIR / "overlay"


def cache_dir() -> Path:
    """Cache for the sdist, build trees and built wheels (``LLAMACPP_INSTR_CACHE`` overrides)."""
    env = os.environ.get("LLAMACPP_INSTR_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llamacpp-instr"
