"""Native units built alone against the patched tree (the pin extracted and patched as `instr
build` does), where the library's own entry points cannot reach the case: tests/native/*.cpp, each
a program that exits 0 when the unit holds."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def build_unit(
    vendor: Path, name: str, includes: list[str], libs: list[str], tmp_path: Path
) -> Path:
    """tests/native/<name>.cpp built against the patched tree's include folders, linked to the
    named libraries of the build the tests run on."""
    from rpc_backend import lib_dir

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / name
    lib = lib_dir()
    cmd = [
        cxx,
        "-std=c++17",
        "-O1",
        "-g",
        *[f"-I{vendor / d}" for d in includes],
        str(HERE / "native" / f"{name}.cpp"),
        *[str(lib / f"{n}.so") for n in libs],
        f"-Wl,-rpath,{lib}",
        "-o",
        str(exe),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return exe


def test_rows_out_of_memory_never_end_the_program(vendor: Path, tmp_path: Path) -> None:
    """json_rows with every allocation from the n-th on failing (issue 55 §1): each failure reaches
    the caller as std::bad_alloc. Before the fix its destructor appended what it held, so the
    second failure, while the first unwound, ended the program (std::terminate) past every catch
    in the hooks."""
    exe = build_unit(vendor, "json_rows_oom", ["src", "ggml/include"], ["libggml-base"], tmp_path)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"died ({r.returncode}): {r.stderr[-2000:]}"
    assert "each caught" in r.stdout and int(r.stdout.split()[0]) > 2, r.stdout


def test_a_kept_graph_is_not_a_graph_with_other_sources(vendor: Path, tmp_path: Path) -> None:
    """A graph built again in the same memory, same nodes, ops and shapes, but reading another
    source (a control vector's or an adapter's, a copy of a new scheduler's) is not the graph kept
    (issue 55 §1): graph_index::same_as tells them apart, and a graph built again the same is
    still found, its sources read again. Before the fix the fingerprint left the sources out, so a
    kept index whose sources were freed was taken for the new graph, and capture() followed them.
    Linked to the build's libllama, which exports the index."""
    exe = build_unit(
        vendor,
        "kept_graph",
        ["src", "include", "ggml/include"],
        ["libllama", "libggml-base"],
        tmp_path,
    )
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
