"""Package discovery, which pyproject.toml cannot express for this layout.

``converters/`` installs as ``llamacpp_instr.converters`` and ``patches/`` as
``llamacpp_instr.patches`` (the mapping is ``[tool.setuptools.package-dir]`` in pyproject.toml).
setuptools' own discovery only finds packages under their import name, so it would miss every
subpackage of a mapped directory: the list is computed here, from the ``__init__.py`` files, and no
subpackage can be left out by hand again (``tests/test_wheel.py`` checks the built wheel).
"""

from setuptools import find_packages, setup

# import name -> source directory (the same mapping as pyproject.toml's package-dir)
MAPPED = {"llamacpp_instr.converters": "converters"}
# directories that hold package data only (no __init__.py): patches and the bundled text
DATA_ONLY = ["llamacpp_instr.patches", "llamacpp_instr.data"]

packages = find_packages(include=["llamacpp_instr", "llamacpp_instr.*"])
for name, where in MAPPED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(where)]

setup(packages=sorted(packages + DATA_ONLY))
