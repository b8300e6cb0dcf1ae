"""Package discovery, which pyproject.toml cannot express for this layout.

``patches/`` installs as ``llamacpp_instr.patches`` (the mapping is
``[tool.setuptools.package-dir]`` in pyproject.toml), package data only, as is
``llamacpp_instr/data``. pyproject.toml's discovery cannot list a mapped package beside the ones it
finds, so the list is computed here: every package under ``llamacpp_instr/`` (from the
``__init__.py`` files: no subpackage can be left out by hand; ``tests/test_wheel.py`` checks the
built wheel), and the two data-only directories.
"""

from setuptools import find_packages, setup

DATA_ONLY = ["llamacpp_instr.patches", "llamacpp_instr.data"]

packages = find_packages(include=["llamacpp_instr", "llamacpp_instr.*"])

setup(packages=sorted(packages + DATA_ONLY))
