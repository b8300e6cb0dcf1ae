"""The wheel holds every package of the source tree (issue 22: ``renderers/`` was missing from it,
which an editable install hides). Built offline from a copy of the sources, so that a stale
``build/`` directory cannot add what the package list forgets. ``.ci/wheel-check`` then installs
such a wheel into a clean virtualenv and renders every report with it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from llamacpp_instr.native.build import read_overlay

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


def _source_packages() -> dict[str, list[str]]:
    """Each package directory of the source tree, as its path in the wheel -> its modules."""
    return {
        init.parent.relative_to(ROOT).as_posix(): sorted(p.name for p in init.parent.glob("*.py"))
        for init in sorted((ROOT / "llamacpp_instr").rglob("__init__.py"))
    }


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("llamacpp_instr", "patches"):
        shutil.copytree(
            ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    dist = tmp_path_factory.mktemp("dist")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = dist.glob("llamacpp_instr-*.whl")
    with zipfile.ZipFile(whl) as z:
        return set(z.namelist())


def test_every_package_is_in_the_wheel(wheel_files: set[str]) -> None:
    packages = _source_packages()
    # the tree as this test knows it: a package list that found nothing would pass vacuously
    assert {"llamacpp_instr", "llamacpp_instr/commands", "llamacpp_instr/converters"} <= set(
        packages
    )
    assert "llamacpp_instr/converters/reports/renderers" in packages
    for where, modules in packages.items():
        assert modules, where
        missing = [m for m in modules if f"{where}/{m}" not in wheel_files]
        assert not missing, f"{where}: {missing} not in the wheel"


def test_package_data_is_in_the_wheel(wheel_files: set[str]) -> None:
    # what `instr build` and `instr doctor` read from an installed package, and quant-eval's text
    lines = (ROOT / "patches" / "series").read_text().splitlines()
    series = [x.strip() for x in lines if x.strip() and not x.startswith("#")]
    assert series
    for name in ["series", *series]:
        assert f"llamacpp_instr/patches/{name}" in wheel_files
    overlay = read_overlay(ROOT / "patches")  # the files `instr build` copies into llama.cpp
    assert overlay
    for rel, _ in overlay:
        assert f"llamacpp_instr/patches/overlay/{rel}" in wheel_files
    assert "llamacpp_instr/data/kjv-genesis.txt" in wheel_files
    assert "llamacpp_instr/contract/schema_v1.json" in wheel_files
