"""The check conftest.py makes around every module: a distribution installed, removed, replaced by
another version or reinstalled (the same wheel again) in the interpreter's environment is named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import environment

pytestmark = pytest.mark.fast


def _install(site: Path, name: str, version: str) -> Path:
    """A distribution's metadata as pip writes it: each file written aside, then renamed in."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    files = {
        "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        "RECORD": f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n",
    }
    for fname, text in files.items():
        (info / (fname + ".tmp")).write_text(text)
        os.replace(info / (fname + ".tmp"), info / fname)
    return info


def _uninstall(info: Path) -> None:
    for f in info.iterdir():
        f.unlink()
    info.rmdir()


def test_every_change_to_a_kept_distribution_is_named(tmp_path: Path) -> None:
    site = str(tmp_path)
    names = ("pkg_a", "pkg_b")
    nothing = environment.installed(names, [site])
    assert nothing == {"pkg_a": None, "pkg_b": None}
    a = _install(tmp_path, "pkg_a", "1.0")
    first = environment.installed(names, [site])
    assert first["pkg_a"] is not None and first["pkg_a"][:2] == ("1.0", str(a))
    assert environment.changes(nothing, first) == [f"pkg_a: installed ({first['pkg_a']})"]
    assert environment.changes(first, environment.installed(names, [site])) == []

    _install(tmp_path, "pkg_a", "1.0")  # the same wheel again: its files are new ones
    again = environment.installed(names, [site])
    assert environment.changes(first, again) == [f"pkg_a: reinstalled (1.0 at {a})"]

    _uninstall(a)
    b = _install(tmp_path, "pkg_a", "2.0")
    other = environment.installed(names, [site])
    assert environment.changes(again, other) == [f"pkg_a: 1.0 at {a} became 2.0 at {b}"]

    _uninstall(b)
    assert environment.changes(other, environment.installed(names, [site])) == [
        f"pkg_a: removed ({other['pkg_a']})"
    ]


def test_the_first_distribution_on_the_path_is_the_one_kept(tmp_path: Path) -> None:
    """A throwaway environment's own build, first on its path, hides the interpreter's: what is
    compared is the one that would be imported."""
    shadow, base = tmp_path / "venv-site", tmp_path / "site"
    _install(base, "pkg_a", "1.0")
    info = _install(shadow, "pkg_a", "0.9")
    found = environment.installed(["pkg_a"], [str(shadow), str(base)])["pkg_a"]
    assert found is not None and found[:2] == ("0.9", str(info))
