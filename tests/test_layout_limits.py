"""The package's layout: rooms by job that import only downward, no import cycle, and no unit too
big to read.

Walks ``llamacpp_instr`` with ``ast`` (nothing is imported). Every import of a module of the package,
wherever it stands (at the top, inside a function, or for type checking only), goes to the
importer's own room or one the room may import (``ROOMS``; docs/internals.md, sections 2 and 3, draws the
stack), and no module reaches itself through them. The converters' modules are under 600 lines,
every class of the package under 200, and every function of it at most 80 lines. What imports
cannot show is checked too: no module imports the package's root, no library module starts the
command line in a process, and deciding/ reaches nothing that loads a library, opens a socket or
starts a process, by any chain of imports.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1] / "llamacpp_instr"
PACKAGE = ROOT / "converters"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 200

_CONVERTERS = {
    "converters.reading": set(),
    "converters.session": {"converters.reading"},
    "converters.traces": {"converters.reading", "converters.session"},
    "converters.analysis": {"converters.reading", "converters.session"},
    "converters.reports": {"converters.reading", "converters.session", "converters.analysis"},
    "converters.formats": {
        "converters.reading",
        "converters.session",
        "converters.traces",
        "converters.analysis",
    },
}
ALL_CONVERTERS = {"converters", *_CONVERTERS}
# each room and the rooms it may import (besides itself); ``contract`` (the log's contract, the
# user's errors, the version) is below every room, and the package's ``__init__`` above them all
ROOMS: dict[str, set[str]] = {
    "contract": set(),
    "native": set(),
    **_CONVERTERS,
    "converters": set(_CONVERTERS),
    "running": {"native", *ALL_CONVERTERS},
    "deciding": {"native", "running", *ALL_CONVERTERS},
    "cli_shared": {"native", "running", "deciding", *ALL_CONVERTERS},
    "commands": {"native", "running", "deciding", "cli_shared", *ALL_CONVERTERS},
    "cli": {"commands"},
    "cli_reference": {"cli", "native"},
    "__init__": {"native", "running", "deciding", "commands", "cli", *ALL_CONVERTERS},
}
for _room, _below in ROOMS.items():
    if _room != "contract":
        _below.add("contract")


def modules(under: Path = PACKAGE) -> list[Path]:
    found = sorted(under.rglob("*.py"))
    assert len(found) > 30, f"only {len(found)} modules under {under}"
    return found


def module_name(path: Path) -> tuple[str, ...]:
    """A module's parts below the package (a package's ``__init__`` named by its folder)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return parts[:-1] if parts and parts[-1] == "__init__" else parts


def room_of(parts: tuple[str, ...]) -> str:
    """The room of a module given by its parts below the package."""
    if not parts:
        return "__init__"
    if parts[0] == "converters" and len(parts) > 1 and f"converters.{parts[1]}" in ROOMS:
        return f"converters.{parts[1]}"
    return parts[0]


def is_module(parts: tuple[str, ...]) -> bool:
    p = ROOT.joinpath(*parts)
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def imports_of(
    text: str, here: tuple[str, ...], package: bool = False
) -> list[tuple[int, tuple[str, ...]]]:
    """(line, module parts below the package) of each import of a package module in a module's
    text, the module given by its parts (``package``: it is a package's ``__init__``)."""
    pkg = here if package else here[:-1]  # the package that relative imports start from
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 > len(pkg):
                    continue
                base = list(pkg[: len(pkg) - (node.level - 1)])
                target = tuple(base + (node.module.split(".") if node.module else []))
            elif node.module and (node.module + ".").startswith("llamacpp_instr."):
                target = tuple(node.module.split(".")[1:])
            else:
                continue
            for a in node.names:  # `from . import x` names a module: count it
                sub = (*target, a.name)
                out.append((node.lineno, sub if is_module(sub) else target))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("llamacpp_instr."):
                    out.append((node.lineno, tuple(a.name.split(".")[1:])))
    return out


def imported(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """``imports_of`` a module of the package, read from its file."""
    return imports_of(
        path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py"
    )


def test_no_module_over_600_lines() -> None:
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in modules()}
    assert max(sizes.values()) > 100  # the walk reads the files it lists
    over = {str(p.relative_to(PACKAGE)): n for p, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_class_over_200_lines() -> None:
    """Every class of the package, the converters' and the others' (the C API's bindings, the
    cost model) alike."""
    classes = 0
    over = {}
    for p in modules(ROOT):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes += 1
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_CLASS_LINES:
                    over[f"{p.relative_to(ROOT)}:{node.name}"] = n
    assert classes > 150, f"only {classes} classes found"
    assert not over, f"classes over {MAX_CLASS_LINES} lines: {over}"


# no function of the package over this many lines (the tests and bench may keep longer ones where a
# table is the point)
MAX_FUNCTION_LINES = 80


def function_sizes() -> dict[str, int]:
    """Every function of the package (methods and nested ones too): "path:name" -> its lines."""
    sizes = {}
    for p in modules(ROOT):
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                key = f"{p.relative_to(ROOT)}:{node.name}"
                sizes[key] = max(n, sizes.get(key, 0))
    return sizes


def test_no_function_over_80_lines() -> None:
    """Functions divide where they divide: none of the package over 80 lines."""
    sizes = function_sizes()
    assert len(sizes) > 1000, f"only {len(sizes)} functions found"
    over = {k: n for k, n in sizes.items() if n > MAX_FUNCTION_LINES}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def climbing(here: tuple[str, ...], found: list[tuple[int, tuple[str, ...]]]) -> list[str]:
    """The imports of module ``here`` that go to a room it may not import."""
    room = room_of(here)
    wrong = []
    for line, target in found:
        other = room_of(target)
        if not (other == room or other in ROOMS[room]):
            wrong.append(f"{'/'.join(here) or '__init__'}:{line} -> {'.'.join(target)}")
    return wrong


def test_rooms_import_only_downward() -> None:
    checked = 0
    wrong = []
    for p in modules(ROOT):
        here = module_name(p)
        assert room_of(here) in ROOMS, f"{p}: a room the layout does not know"
        found = imported(p)
        checked += len(found)
        wrong += climbing(here, found)
    assert checked > 500, f"only {checked} imports checked"
    assert not wrong, "imports that climb or cross rooms:\n" + "\n".join(wrong)


def cycles(graph: dict[tuple[str, ...], set[tuple[str, ...]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[tuple[str, ...], int] = {}
    low: dict[tuple[str, ...], int] = {}
    stack: list[tuple[str, ...]] = []
    on: set[tuple[str, ...]] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on.discard(m)
                        comp.append(".".join(m) or "llamacpp_instr")
                        if m == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_cycle() -> None:
    """Type-only and function-level imports count: a cycle is a cycle wherever it is written."""
    graph = {}
    for p in modules(ROOT):
        here = module_name(p)
        graph[here] = {t for _, t in imported(p) if t != here}
    assert len(graph) > 150
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_a_cycle_is_caught() -> None:
    a, b, c = ("a",), ("b",), ("c",)
    assert cycles({a: {b}, b: {c}, c: {a}}) == [["a", "b", "c"]]
    assert cycles({a: {b}, b: {c}, c: set()}) == []


def test_a_climbing_import_is_caught() -> None:
    """The same walk flags an import from reading up to reports, one across from traces to
    analysis, one from the contract into a room and one from the converters up to running; it passes
    one going down."""
    up = imports_of("from ..reports.summary import x\n", ("converters", "reading", "x"))
    assert up == [(1, ("converters", "reports", "summary"))]
    assert climbing(("converters", "reading", "x"), up)
    across = imports_of("from ..analysis import frames\n", ("converters", "traces", "x"))
    assert across == [(1, ("converters", "analysis", "frames"))]
    assert climbing(("converters", "traces", "x"), across)
    root = imports_of(
        "from llamacpp_instr.converters.session.fold import Fold\n", ("contract", "schema")
    )
    assert climbing(("contract", "schema"), root)
    out = imports_of("from llamacpp_instr.running import runner\n", ("converters", "session", "x"))
    assert climbing(("converters", "session", "x"), out)
    down = imports_of("from ...session.fold import Fold\n", ("converters", "reports", "quant", "x"))
    assert down == [(1, ("converters", "session", "fold"))]
    assert not climbing(("converters", "reports", "quant", "x"), down)


# --- what the import graph cannot see: the package's root, and the CLI started in a process ---

# the modules that are the command line (they may name it); every other module is the library
CLI_ROOMS = {"commands", "cli", "cli_reference"}
# calls that start a process (a module that makes none may still spell a command line for a user)
_STARTERS = {"subprocess", "multiprocessing", "os.exec", "os.spawn", "os.posix_spawn"}


def root_imports(text: str, here: tuple[str, ...]) -> list[str]:
    """The package's root imported by a module of it: ``import llamacpp_instr`` or ``from
    llamacpp_instr import X`` where X is no module (a name the root's ``__init__`` holds). The root
    sits above every room: what a module needs lives in a room below."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno}: import {a.name}" for a in node.names if a.name == ROOT.name]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module == ROOT.name:
            out += [
                f"{node.lineno}: from {ROOT.name} import {a.name}"
                for a in node.names
                if not is_module((a.name,))
            ]
    where = "/".join(here) or "__init__"
    return [f"{where}:{line}" for line in out]


def cli_processes(text: str, here: tuple[str, ...]) -> list[str]:
    """The command line started as a process by a library module: a string naming the CLI's
    module (``llamacpp_instr.cli``), ``-m llamacpp_instr...`` in a command line, or, in a module
    that starts processes, a command line beginning with ``instr``. The library calls the library;
    the CLI is its front door, never its back one."""
    tree = ast.parse(text)
    dump = ast.unparse(tree)
    starts = any(s in dump for s in _STARTERS)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if re.search(rf"\b{ROOT.name}\.cli\b", node.value):  # (not cli_shared)
                out.append(f"{node.lineno}: {node.value[:60]!r}")
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for a, b in zip(words, words[1:], strict=False):
                if a == "-m" and isinstance(b, str) and b.split(".")[0] == ROOT.name:
                    out.append(f"{node.lineno}: -m {b}")
            if starts and words[:1] == ["instr"]:
                out.append(f"{node.lineno}: a command line starting with instr")
    where = "/".join(here) or "__init__"
    return [f"{where}:{line}" for line in out]


def test_no_module_imports_the_packages_root() -> None:
    checked = 0
    wrong = []
    for p in modules(ROOT):
        here = module_name(p)
        if here:  # (the root's own __init__ is the root)
            checked += 1
            wrong += root_imports(p.read_text(encoding="utf-8"), here)
    assert checked > 150
    assert not wrong, "modules importing the package's root:\n" + "\n".join(wrong)


def test_no_library_module_starts_the_cli() -> None:
    checked = 0
    wrong = []
    for p in modules(ROOT):
        here = module_name(p)
        if room_of(here) in CLI_ROOMS:
            continue
        checked += 1
        wrong += cli_processes(p.read_text(encoding="utf-8"), here)
    assert checked > 150
    assert not wrong, "library modules starting the command line:\n" + "\n".join(wrong)


def test_a_root_import_and_a_cli_process_are_caught() -> None:
    """Each form is flagged, and what is not one passes: a submodule named from the root, a
    module run by -m that is not the package's, a command line spelled for a user."""
    here = ("running", "x")
    assert root_imports("import llamacpp_instr\n", here) == ["running/x:1: import llamacpp_instr"]
    assert root_imports("from llamacpp_instr import __version__\n", here)
    assert not root_imports("from llamacpp_instr import converters\n", here)
    assert not root_imports("import llamacpp_instr.converters\n", here)
    started = "import subprocess, sys\nsubprocess.run([sys.executable, {}, 'follow'])\n"
    assert cli_processes(started.format("'-m', 'llamacpp_instr.cli'"), here)
    assert cli_processes(started.format("'-m', 'llamacpp_instr'"), here)
    assert cli_processes("import subprocess\nsubprocess.run(['instr', 'run'])\n", here)
    assert cli_processes("x = 'python -m llamacpp_instr.cli run'\n", here)
    assert not cli_processes(started.format("'-m', 'pip'"), here)
    assert not cli_processes("advice = ['instr', 'run', 'model.gguf']\n", here)


# --- deciding decides: from what acting code measured, handed in as data ---

# what acts, by the modules that do it: a module of the package that imports one (at its top or
# inside a function, itself or a submodule of it) loads a library, opens a socket or starts a process
ACTS = {
    **dict.fromkeys(("ctypes", "cffi", "llama_cpp"), "loads a library"),
    **dict.fromkeys(
        ("socket", "ssl", "socketserver", "http.client", "http.server", "urllib.request", "xmlrpc")
        + ("asyncio", "httpx", "requests", "aiohttp", "websockets", "uvicorn", "starlette"),
        "opens a socket",
    ),
    **dict.fromkeys(("subprocess", "multiprocessing", "pty"), "starts a process"),
}
# os's own calls that start a process (os.exec*, os.spawn* and os.posix_spawn* by prefix)
_OS_STARTS = ("system", "popen", "fork", "forkpty", "exec", "spawn", "posix_spawn")
# what a module may do of ``ACTS`` though deciding reaches it, and why it is no act on the machine
PERMITTED = {
    # a big log's lines parsed in a fork of this process, on the other core: it runs no program
    # and touches no device, and yields what reading the log here would
    ("converters", "reading", "prefetch"): {"multiprocessing"},
}
# imports deciding still reaches acting code through, not followed by the walk until they go: each
# (importer, imported) with what it carries
KNOWN: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}


def acts_in(text: str) -> list[tuple[int, str]]:
    """(line, what) of each import of a module of ``ACTS`` in a module's text, and of each call of
    os that starts a process."""
    out = []
    for node in ast.walk(ast.parse(text)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr.startswith(_OS_STARTS)
        ):
            out.append((node.lineno, f"os.{node.attr} (starts a process)"))
        for name in names:  # (the module first: ``from socket import x`` is one act)
            act = next((m for m in ACTS if name == m or name.startswith(m + ".")), None)
            if act is not None:
                out.append((node.lineno, f"{name} ({ACTS[act]})"))
                break
    return out


def permitted(module: tuple[str, ...], what: str) -> bool:
    """Whether ``PERMITTED`` lets ``module`` do ``what`` (an ``acts_in`` entry's)."""
    name = what.split()[0]
    return any(name == m or name.startswith(m + ".") for m in PERMITTED.get(module, ()))


def reaching(
    graph: dict[tuple[str, ...], set[tuple[str, ...]]],
    acts: dict[tuple[str, ...], list[tuple[int, str]]],
    known: set[tuple[tuple[str, ...], tuple[str, ...]]],
) -> list[str]:
    """Every module the modules of deciding/ reach by imports (``graph``, the ``known`` edges left
    out) that acts (``acts``: its ``acts_in``, less what ``PERMITTED`` lets it do), each with the
    import path from deciding/ that reaches it (breadth first: a shortest one)."""
    start = sorted(m for m in graph if room_of(m) == "deciding")
    came: dict[tuple[str, ...], tuple[str, ...] | None] = dict.fromkeys(start)
    queue = list(start)
    for here in queue:
        for there in sorted(graph.get(here, ())):
            if there not in came and (here, there) not in known:
                came[there] = here
                queue.append(there)
    out = []
    for m in queue:
        found = [f"{line}: {what}" for line, what in acts.get(m, []) if not permitted(m, what)]
        if found:
            path, at = [], m
            while at is not None:
                path.append(".".join(at))
                at = came[at]
            out.append(" -> ".join(reversed(path)) + ": " + "; ".join(found))
    return out


def package_graph() -> (
    tuple[dict[tuple[str, ...], set[tuple[str, ...]]], dict[tuple[str, ...], list[tuple[int, str]]]]
):
    """The package's import graph (``imported``: every import, at the top or inside a function)
    and what each module does of ``ACTS`` itself."""
    graph, acts = {}, {}
    for p in modules(ROOT):
        here = module_name(p)
        graph[here] = {t for _, t in imported(p) if t != here}
        acts[here] = acts_in(p.read_text(encoding="utf-8"))
    return graph, acts


def test_deciding_reaches_nothing_that_acts() -> None:
    """No module of deciding/ reaches, by any chain of imports, one that loads a library, opens a
    socket or starts a process: the planners take what ``running`` measured (``measures.Machine``)
    as data. The edges of ``KNOWN`` are left out while they stand, and each must still stand."""
    graph, acts = package_graph()
    assert sum(len(a) for a in acts.values()) > 30  # the package does act, below deciding
    gone = [f"{'.'.join(a)} -> {'.'.join(b)}" for a, b in KNOWN if b not in graph.get(a, set())]
    assert not gone, "known edges no longer there (remove them from KNOWN): " + ", ".join(gone)
    reached = reaching(graph, acts, set(KNOWN))
    assert not reached, "deciding/ reaching what acts:\n" + "\n".join(reached)


def test_an_acting_module_deciding_reaches_is_caught() -> None:
    """Two hops away, through an import inside a function, a submodule named by ``from``, an os
    call; a known edge is not followed, and what ``PERMITTED`` allows is not flagged."""
    d, a, b, c = ("deciding", "x"), ("running", "a"), ("running", "b"), ("native", "c")
    inner = acts_in("def f():\n    import ctypes\n")
    assert inner == [(2, "ctypes (loads a library)")]
    assert acts_in("from http import client\n") == [(1, "http.client (opens a socket)")]
    assert acts_in("import os\nos.execv('x', [])\n") == [(2, "os.execv (starts a process)")]
    assert not acts_in("from http import HTTPStatus\nimport os\nos.path.join('a')\n")
    graph = {d: {a}, a: {b}, b: {c}, c: set()}
    acts = {c: inner}
    assert reaching(graph, acts, set()) == [
        "deciding.x -> running.a -> running.b -> native.c: 2: ctypes (loads a library)"
    ]
    assert not reaching(graph, acts, {(a, b)})
    fork = ("converters", "reading", "prefetch")
    forks = acts_in("import multiprocessing\n")
    assert not reaching({d: {fork}, fork: set()}, {fork: forks}, set())
    assert reaching({d: {fork}, fork: set()}, {fork: forks + inner}, set())
