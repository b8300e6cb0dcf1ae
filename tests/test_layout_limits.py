"""The converters' layout: rooms by job that import only downward, and no unit too big to read.

Walks ``llamacpp_instr/converters`` with ``ast`` (nothing is imported): every module under 600
lines, every class under 200 (and every function of the whole package at most 120), and every import that names a module of the package goes to the
importer's own room or one below it (docs/internals.md, section 3, draws the stack).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llamacpp_instr" / "converters"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 200
MAX_FUNCTION_LINES = 120

# each room and the rooms it may import (besides itself); the package's root modules
# (errors, schema) are below every room, and its __init__ above them all
ROOMS: dict[str, set[str]] = {
    "reading": set(),
    "session": {"reading"},
    "traces": {"reading", "session"},
    "analysis": {"reading", "session"},
    "reports": {"reading", "session", "analysis"},
}


def modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 30, f"only {len(found)} modules under {PACKAGE}"
    return found


def room_of(parts: tuple[str, ...]) -> str | None:
    """The room of a module given by its parts below the package (None: the package's root)."""
    return parts[0] if len(parts) > 1 else None


def imported(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module parts below the package) of each import of a converters module."""
    here = path.relative_to(PACKAGE).with_suffix("").parts
    return imports_of(path.read_text(encoding="utf-8"), here)


def imports_of(text: str, here: tuple[str, ...]) -> list[tuple[int, tuple[str, ...]]]:
    """``imported`` of a module's text, the module given by its parts below the package."""
    pkg = here[:-1]  # the package that relative imports start from
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg[: len(pkg) - (node.level - 1)]) if node.level > 1 else list(pkg)
                if node.level - 1 > len(pkg):
                    continue  # above the package (never written today)
                target = tuple(base + (node.module.split(".") if node.module else []))
            elif node.module and node.module.startswith("llamacpp_instr.converters"):
                target = tuple(node.module.split(".")[2:])
            else:
                continue
            for a in node.names:  # `from . import x` names a module: count it
                sub = PACKAGE.joinpath(*target, a.name)
                is_module = sub.with_suffix(".py").exists() or sub.is_dir()
                out.append((node.lineno, (*target, a.name) if is_module else target))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("llamacpp_instr.converters."):
                    out.append((node.lineno, tuple(a.name.split(".")[2:])))
    return out


def test_no_module_over_600_lines() -> None:
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in modules()}
    assert max(sizes.values()) > 100  # the walk reads the files it lists
    over = {str(p.relative_to(PACKAGE)): n for p, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_class_over_200_lines() -> None:
    classes = 0
    over = {}
    for p in modules():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes += 1
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_CLASS_LINES:
                    over[f"{p.relative_to(PACKAGE)}:{node.name}"] = n
    assert classes > 50, f"only {classes} classes found"
    assert not over, f"classes over {MAX_CLASS_LINES} lines: {over}"


def test_no_function_over_120_lines() -> None:
    """Every function of the package, not only the converters', reads on a screen or two."""
    functions = 0
    over = {}
    for p in sorted(PACKAGE.parent.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions += 1
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_FUNCTION_LINES:
                    over[f"{p.relative_to(PACKAGE.parent)}:{node.name}"] = n
    assert functions > 1000, f"only {functions} functions found"
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def climbing(here: tuple[str, ...], found: list[tuple[int, tuple[str, ...]]]) -> list[str]:
    """The imports of module ``here`` that go to a room it may not import."""
    room = room_of(here)
    wrong = []
    for line, target in found:
        other = room_of(target)
        if room is None:  # the root: errors and schema import no room; __init__ may import all
            ok = here[-1] == "__init__" or other is None
        elif other is None:
            ok = not target or target[0] in ("errors", "schema")
        else:
            ok = other == room or other in ROOMS[room]
        if not ok:
            wrong.append(f"{'/'.join(here)}:{line} -> {'.'.join(target)}")
    return wrong


def test_rooms_import_only_downward() -> None:
    checked = 0
    wrong = []
    for p in modules():
        here = p.relative_to(PACKAGE).with_suffix("").parts
        room = room_of(here)
        assert room is None or room in ROOMS, f"{p}: a room the layout does not know"
        found = imported(p)
        checked += len(found)
        wrong += climbing(here, found)
    assert checked > 100, f"only {checked} imports checked"
    assert not wrong, "imports that climb or cross rooms:\n" + "\n".join(wrong)


def test_a_climbing_import_is_caught() -> None:
    """The same walk flags an import from reading up to reports, one across from traces to
    analysis, and one from the root's schema into a room; it passes one going down."""
    up = imports_of("from ..reports.summary import x\n", ("reading", "x"))
    assert up == [(1, ("reports", "summary"))]
    assert climbing(("reading", "x"), up)
    across = imports_of("from ..analysis import frames\n", ("traces", "x"))
    assert across == [(1, ("analysis", "frames"))]
    assert climbing(("traces", "x"), across)
    root = imports_of("from .session.fold import Fold\n", ("schema",))
    assert climbing(("schema",), root)
    down = imports_of("from ...session.fold import Fold\n", ("reports", "quant", "x"))
    assert down == [(1, ("session", "fold"))]
    assert not climbing(("reports", "quant", "x"), down)
