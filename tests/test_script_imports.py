"""The scripts the suite never runs still name modules that exist.

``tests/fixtures/make_fixtures.py`` (which regenerates the committed logs) and the benches in
``bench/`` run by hand, and the README's and docs' examples by readers: when the package's root was
sorted into ``native/``, ``running/`` and ``deciding/``, make_fixtures.py kept importing
``llamacpp_instr.runner`` and nothing failed. Each ``from llamacpp_instr... import NAME`` and
``import llamacpp_instr...`` of them is resolved here with ``ast`` against the package's files
(nothing is imported, so the check needs neither the build nor pandas).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]


def scripts() -> list[Path]:
    found = sorted((ROOT / "bench").glob("*.py")) + sorted((ROOT / "tests/fixtures").glob("*.py"))
    assert len(found) > 5, found
    return found


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def module_file(dotted: str) -> Path | None:
    """The file of the package's module ``dotted`` (a package's ``__init__.py``), or None."""
    parts = dotted.split(".")
    if parts[0] != "llamacpp_instr":
        return None
    base = ROOT.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def names_of(path: Path) -> set[str]:
    """The names a module defines at its top level, and those its ``__all__`` lists (the root's
    session API is loaded on first use, through ``__getattr__``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                names.update(ast.literal_eval(node.value))
        elif isinstance(node, ast.If):  # `if TYPE_CHECKING:` imports
            for sub in node.body:
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return names


def unresolved(source: str) -> list[str]:
    """The package's modules and names ``source`` imports that do not exist."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("llamacpp_instr") and module_file(alias.name) is None:
                    missing.append(alias.name)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if not node.module.startswith("llamacpp_instr"):
                continue
            path = module_file(node.module)
            if path is None:
                missing.append(node.module)
                continue
            defined = names_of(path)
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if alias.name != "*" and alias.name not in defined and module_file(full) is None:
                    missing.append(full)
    return missing


@pytest.mark.parametrize("path", scripts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_script_imports_what_the_package_has(path: Path) -> None:
    assert unresolved(path.read_text(encoding="utf-8")) == []


def test_the_docs_examples_import_what_the_package_has() -> None:
    blocks = 0
    for doc in documents():
        for block in re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            blocks += 1
            try:
                missing = unresolved(block)
            except SyntaxError:  # a fragment (an elided body), not a program
                continue
            assert missing == [], (doc.name, block[:200])
    assert blocks > 0


def test_a_moved_module_is_caught() -> None:
    # the import make_fixtures.py kept after the root was sorted, and its fix
    assert unresolved("from llamacpp_instr import runner") == ["llamacpp_instr.runner"]
    assert unresolved("from llamacpp_instr.running import runner") == []
    assert unresolved("import llamacpp_instr.vulkan_env") == ["llamacpp_instr.vulkan_env"]
    assert unresolved("from llamacpp_instr.running.runner import no_such_name") == [
        "llamacpp_instr.running.runner.no_such_name"
    ]
    assert unresolved("from llamacpp_instr import load_session, session") == []
