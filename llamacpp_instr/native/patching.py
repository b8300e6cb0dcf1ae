"""The patches and the overlay: ``patches/series`` and ``patches/overlay/`` read, their hash (what
a built library reports as ``producer.patch_hash``), and the overlay copied into, and the
patches applied to, an extracted sdist.

The new native source files in ``patches/overlay/`` are copied into the vendored llama.cpp (as they
are laid out there: ``src/llama-instr-*.cpp``, ``include/llama-instr.h``) before the patches; the
numbered patches only edit files llama.cpp already has.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import pin
from llamacpp_instr.native.paths import PATCHES_DIR
from llamacpp_instr.native.progress import Echo

# A series entry under this folder applies to the sdist root, the others to the vendored llama.cpp.
PYTHON_PATCH_DIR = "python"


# The overlay's list of libllama's sources, which the patched src/CMakeLists.txt includes, and the
# CMake file that names the overlay's sources of each folder (ggml-cuda compiles every .cu of its
# folder, so its overlay sources need none).
OVERLAY_CMAKE_LIST = "llama-instr.cmake"


OVERLAY_CMAKE_LISTS = {"src": f"src/{OVERLAY_CMAKE_LIST}"}


def read_series(patches_dir: Path = PATCHES_DIR) -> tuple[Path, ...]:
    """The patches named in ``patches/series``, in order."""
    series = patches_dir / "series"
    if not series.is_file():
        raise UserError(f"patch series not found: {series}")
    names = [
        ln.strip()
        for ln in series.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    paths = tuple(patches_dir / n for n in names)
    for p in paths:
        if not p.is_file():
            raise UserError(f"patch listed in {series.name} is missing: {p.name}")
    return paths


def read_overlay(patches_dir: Path = PATCHES_DIR) -> tuple[tuple[str, Path], ...]:
    """The new source files to copy into llama.cpp: (relative path there, file), sorted."""
    root = patches_dir / "overlay"
    if not root.is_dir():
        return ()
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    return tuple((p.relative_to(root).as_posix(), p) for p in files)


def patch_hash(
    patches: Sequence[Path],
    cmake_args: Sequence[str] = (),
    overlay: Sequence[tuple[str, Path]] = (),
) -> str:
    """Short hash of the pin, the patches' and overlay files' contents and the build options."""
    h = hashlib.sha256()
    h.update(pin.SDIST_SHA256.encode())
    for p in patches:
        h.update(b"\0patch\0" + p.name.encode() + b"\0" + p.read_bytes())
    for rel, p in overlay:
        h.update(b"\0overlay\0" + rel.encode() + b"\0" + p.read_bytes())
    for a in cmake_args:
        h.update(b"\0cmake\0" + a.encode())
    return h.hexdigest()[:12]


def source_patch_hash(patches_dir: Path = PATCHES_DIR) -> str:
    """Hash of pin + patches + overlay as the built library reports it (``producer.patch_hash``)."""
    return patch_hash(read_series(patches_dir), overlay=read_overlay(patches_dir))


def _git_apply(root: Path, patch: Path, check: bool) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    # never let git discover an enclosing repository: apply relative to the given tree
    env["GIT_CEILING_DIRECTORIES"] = str(root.parent)
    cmd = ["git", "apply", "-v"] + (["--check"] if check else []) + [str(patch)]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)


def _patch_root(root: Path, patch: Path) -> Path:
    """Where a patch applies: the sdist root for python/ patches, else the vendored llama.cpp."""
    return root if patch.parent.name == PYTHON_PATCH_DIR else root / pin.VENDOR_DIR


def copy_overlay(root: Path, overlay: Sequence[tuple[str, Path]], echo: Echo) -> None:
    """Copy the new source files into the vendored llama.cpp; they must not replace any file."""
    vendor = root / pin.VENDOR_DIR
    for rel, src in overlay:
        dest = vendor / rel
        if dest.exists():
            raise UserError(f"overlay file {rel} would replace a file of the pinned llama.cpp")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    if overlay:
        echo(f"  overlay: {len(overlay)} new source files copied into llama.cpp")


def check_overlay_listed(root: Path, overlay: Sequence[tuple[str, Path]]) -> None:
    """Every overlay source must be compiled: named, once patched, in the CMake list of its folder
    (``OVERLAY_CMAKE_LISTS``; libllama's is the overlay's own src/llama-instr.cmake, which the
    patched src/CMakeLists.txt must include)."""
    vendor = root / pin.VENDOR_DIR
    if OVERLAY_CMAKE_LIST not in (vendor / "src" / "CMakeLists.txt").read_text():
        raise UserError(f"the patched src/CMakeLists.txt does not include {OVERLAY_CMAKE_LIST}")
    for rel, _ in overlay:
        folder, _, name = rel.rpartition("/")
        listing = OVERLAY_CMAKE_LISTS.get(folder)
        if listing is None or not name.endswith(".cpp"):
            continue
        path = vendor / listing
        if not path.is_file() or name not in path.read_text():
            raise UserError(f"overlay source {rel} is not listed in the patched {listing}")


def apply_patches(root: Path, patches: Sequence[Path], echo: Echo) -> None:
    for p in patches:
        where = _patch_root(root, p)
        r = _git_apply(where, p, check=True)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
            detail = "; ".join(lines[:3]) or r.stderr.strip().splitlines()[-1]
            raise UserError(f"patch {p.name} does not apply: {detail}")
        # patches may build on each other: apply each one (into a throw-away tree for --check)
        r = _git_apply(where, p, check=False)
        if r.returncode != 0:
            raise UserError(f"patch {p.name} failed to apply: {r.stderr.strip()}")
        echo(f"  {p.name}: applies cleanly")
