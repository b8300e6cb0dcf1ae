#!/usr/bin/env python3
"""A git tree of the pin for working on the native code: edit, rebuild incrementally, regenerate.

    python patches/devtree.py init DIR      # the pin, the overlay, then one commit per patch
    python patches/devtree.py build DIR [--vulkan] [--cmake-arg=...] [--target T ...]
    python patches/devtree.py export DIR    # the tree's commits back into patches/ and overlay/

``init`` extracts the pinned sdist under DIR (as ``instr build`` does) and makes its vendored
llama.cpp a git repository: commit 1 is the pin, commit 2 (tagged ``instr-overlay``) adds
patches/overlay/, and each numbered patch is applied with ``git am``, so that a patch is a commit
to amend (``git commit --fixup`` and ``git rebase -i --autosquash``) and a new patch is a new
commit on top.

``build`` runs an incremental CMake build (Ninja, ccache when installed) of the shared libraries
the Python bindings load (libmtmd among them), and the programs named with --target (llama-server,
ggml-rpc-server, ...), in DIR/build, and prints the LLAMA_CPP_LIB_PATH and MTMD_CPP_LIB that run
the installed package on them.

``export`` writes the commits after ``instr-overlay`` back as patches/NNNN-*.patch with ``git
format-patch`` (overlay files excluded: they are copied back into patches/overlay/ instead).
A patch whose change and message are the same as the file already there is left untouched, so
that two branches that each edit one patch do not conflict on the others' headers.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llamacpp_instr.native import build, pin  # noqa: E402
from llamacpp_instr.native.paths import PATCHES_DIR  # noqa: E402

OVERLAY_TAG = "instr-overlay"
# Where the overlay's files live in llama.cpp: export copies these back, format-patch skips them.
# ggml's are the headers beside its backends' own (ggml-cpu-instr.h, ...) and the files beside a
# backend's sources (ggml-cuda/instr.cu, ...); no file of the pin matches one.
OVERLAY_GLOBS = (
    "src/llama-instr*",
    "include/llama-instr*",
    "tools/llama-instr*",
    "ggml/include/ggml-*-instr.h",
    "ggml/src/ggml-*/instr.*",
)
IDENTITY = ["-c", "user.name=llamacpp-instr", "-c", "user.email=dev@llamacpp-instr.invalid"]


def _git(tree: Path, *args: str, capture: bool = False) -> str:
    r = subprocess.run(
        ["git", *IDENTITY, *args], cwd=tree, check=True, text=True, capture_output=capture
    )
    return r.stdout if capture else ""


def vendor(dir_: Path) -> Path:
    """The vendored llama.cpp under DIR (the sdist extracts into a folder named for its version)."""
    found = sorted((dir_ / "src").glob(f"*/{pin.VENDOR_DIR}"))
    if not found:
        sys.exit(f"{dir_}: no tree here (run `init` first)")
    return found[0]


def init(dir_: Path) -> None:
    root = build.extract_sdist(build.fetch_sdist(print), dir_ / "src")
    tree = root / pin.VENDOR_DIR
    _git(tree, "init", "-q")
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", f"llama.cpp {pin.LLAMA_CPP_COMMIT} (llama-cpp-python sdist)")
    overlay = build.read_overlay()
    for rel, path in overlay:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, tree / rel)
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", "llamacpp-instr overlay")
    _git(tree, "tag", "-f", OVERLAY_TAG)
    for patch in build.read_series():
        if patch.parent.name == build.PYTHON_PATCH_DIR:
            subprocess.run(["git", "apply", str(patch)], cwd=root, check=True)
        else:
            _git(tree, "am", "-q", "--keep-cr", "--committer-date-is-author-date", str(patch))
    print(f"{tree}: {len(overlay)} overlay files, patches as commits after tag {OVERLAY_TAG}")


def build_libs(dir_: Path, vulkan: bool, cmake_args: list[str], targets: list[str]) -> None:
    tree = vendor(dir_)
    bdir = dir_ / "build"
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DLLAMA_BUILD_COMMON=" + ("ON" if targets else "OFF"),
        "-DLLAMA_BUILD_TOOLS=" + ("ON" if targets else "OFF"),
        "-DLLAMA_BUILD_SERVER=" + ("ON" if targets else "OFF"),
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        # libmtmd on its own when the tools (which add it) are off
        "-DLLAMA_BUILD_MTMD=ON",
        *build.DEFAULT_CMAKE_ARGS,
        f"-DLLAMA_INSTR_LLAMA_COMMIT={pin.LLAMA_CPP_COMMIT}",
        "-DLLAMA_INSTR_PATCH_HASH=devtree",
        *(["-DGGML_VULKAN=ON"] if vulkan else []),
        *cmake_args,
    ]
    env = dict(os.environ)
    if shutil.which("ccache"):
        args += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        # paths relative to the build folder, so that every developer's tree shares cache entries
        env["CCACHE_BASEDIR"] = str(dir_)
        env["CCACHE_NOHASHDIR"] = "true"
    if shutil.which("ninja"):
        args += ["-G", "Ninja"]
    if not (bdir / "CMakeCache.txt").exists() or cmake_args:
        subprocess.run(["cmake", "-S", str(tree), "-B", str(bdir), *args], check=True, env=env)
    jobs = str(os.cpu_count() or 2)
    names = ["llama", "ggml", "ggml-rpc", "mtmd", *targets]
    subprocess.run(
        ["cmake", "--build", str(bdir), "-j", jobs, "--target", *names], check=True, env=env
    )
    print(f"LLAMA_CPP_LIB_PATH={bdir / 'bin'} MTMD_CPP_LIB={bdir / 'bin'}")


def _body(text: str) -> str:
    """A patch without what changes when it is regenerated (commit id, date, numbering, index)."""
    text = re.sub(r"^From [0-9a-f]{40} .*\n", "", text, count=1, flags=re.M)
    text = re.sub(r"^Date: .*\n", "", text, count=1, flags=re.M)
    # the subject unfolded: its numbering's width moves where git folds it
    text = re.sub(
        r"^Subject: \[PATCH[^\]]*\] ?((?:.*)(?:\n .*)*)",
        lambda m: "Subject: " + " ".join(m.group(1).split()),
        text,
        count=1,
        flags=re.M,
    )
    text = re.sub(r"^index [0-9a-f]+\.\.[0-9a-f]+.*\n", "", text, flags=re.M)
    return re.sub(r"\n-- \n.*\Z", "\n", text, flags=re.S)


def export(dir_: Path) -> None:
    tree = vendor(dir_)
    series = build.read_series()
    old = [p for p in series if p.parent.name != build.PYTHON_PATCH_DIR]
    python = [p for p in series if p.parent.name == build.PYTHON_PATCH_DIR]
    with tempfile.TemporaryDirectory() as tmp:
        exclude = [f":(exclude,glob){g}" for g in OVERLAY_GLOBS]
        _git(
            tree,
            "format-patch",
            "-q",
            "-o",
            tmp,
            f"{OVERLAY_TAG}..HEAD",
            "--",
            ".",
            *exclude,
        )
        new = sorted(Path(tmp).glob("*.patch"))
        names = []
        for i, patch in enumerate(new):
            prev = old[i] if i < len(old) else None
            if prev is not None and _body(prev.read_text()) == _body(patch.read_text()):
                names.append(prev.name)
                continue
            if prev is not None and prev.name != patch.name:
                prev.unlink()
            shutil.copy2(patch, PATCHES_DIR / patch.name)
            names.append(patch.name)
            print(f"wrote {patch.name}")
        for stale in old[len(new) :]:
            stale.unlink()
            print(f"removed {stale.name}")
    head = [ln for ln in (PATCHES_DIR / "series").read_text().splitlines() if ln.startswith("#")]
    rels = names + [f"{build.PYTHON_PATCH_DIR}/{p.name}" for p in python]
    (PATCHES_DIR / "series").write_text("\n".join(head + rels) + "\n")
    # the overlay: every file of the tree that matches its globs, copied back as it is now
    files = {p for g in OVERLAY_GLOBS for p in tree.glob(g) if p.is_file()}
    kept = {(PATCHES_DIR / "overlay" / p.relative_to(tree)) for p in files}
    for rel, path in build.read_overlay():
        if path not in kept:
            path.unlink()
            print(f"removed overlay/{rel}")
    for p in sorted(files):
        dest = PATCHES_DIR / "overlay" / p.relative_to(tree)
        if not dest.exists() or dest.read_bytes() != p.read_bytes():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dest)
            print(f"wrote overlay/{p.relative_to(tree)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("init", "build", "export"):
        p = sub.add_parser(name)
        p.add_argument("dir", type=Path)
        if name == "build":
            p.add_argument("--vulkan", action="store_true")
            p.add_argument("--cmake-arg", action="append", default=[])
            p.add_argument("--target", action="append", default=[])
    a = ap.parse_args()
    if a.cmd == "init":
        init(a.dir.resolve())
    elif a.cmd == "build":
        build_libs(a.dir.resolve(), a.vulkan, a.cmake_arg, a.target)
    else:
        export(a.dir.resolve())


if __name__ == "__main__":
    main()
