"""The overlay's libllama sources call one another without a circle.

Each ``patches/overlay/src/llama-instr-*.cpp`` is read for the functions it defines at namespace
scope (not ``static``: those are its own) and for the calls it makes of a name another file
defines (a plain call: a member's ``.emit(`` or a qualified ``x::emit(`` is not one, nor a name the
calling file defines itself). A file that calls into another which calls back into it, directly or
through others, is a circle: the piece they share belongs in one of them, or below both.

``KNOWN`` lists the circles not broken yet, each as its files in order. It only shrinks: an entry
that no longer matches a circle fails too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

SRC = Path(__file__).resolve().parents[1] / "patches" / "overlay" / "src"

# (none left: the process's session and clock, which the memory table and the session's code both
# write through, are beneath both, in llama-instr-registry.cpp)
KNOWN: set[tuple[str, ...]] = set()

_DEF = re.compile(
    r"^(static\s+)?(?:[\w:<>,*&]+\s+)*?[*&]?\s*([A-Za-z_]\w*)\s*\([^;{}]*\)\s*(?:noexcept\s*)?(?:const\s*)?\{",
    re.M,
)
_KEYWORDS = {"if", "for", "while", "switch", "return", "catch", "sizeof"}


def _code(path: Path) -> str:
    """The file without its comments and string literals."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def calls() -> dict[str, set[str]]:
    """Each file, and the files whose functions it calls."""
    code = {p.name: _code(p) for p in sorted(SRC.glob("llama-instr-*.cpp"))}
    own: dict[str, set[str]] = {}
    public: dict[str, set[str]] = {}
    for name, text in code.items():
        for m in _DEF.finditer(text):
            fn = m.group(2)
            if fn in _KEYWORDS:
                continue
            own.setdefault(name, set()).add(fn)
            if not m.group(1):
                public.setdefault(fn, set()).add(name)
    graph: dict[str, set[str]] = {name: set() for name in code}
    for name, text in code.items():
        for fn, where in public.items():
            if fn in own.get(name, set()) or name in where:
                continue
            if re.search(rf"(?<![.\w>:])\s*{re.escape(fn)}\s*\(", text):
                graph[name] |= where
    return graph


def circles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected sets of files of more than one, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.add(tuple(sorted(part)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_reader_sees_the_calls() -> None:
    graph = calls()
    assert len(graph) >= 20
    # the session's own functions are called from the files that write records
    assert "llama-instr-session.cpp" in graph["llama-instr-sampling.cpp"]
    assert "llama-instr-session.cpp" in graph["llama-instr-step.cpp"]


def test_no_circle_among_the_overlay_sources() -> None:
    found = circles(calls())
    assert found - KNOWN == set(), f"files that call one another: {sorted(found - KNOWN)}"
    assert (
        KNOWN - found == set()
    ), f"circles broken since: drop them from KNOWN: {sorted(KNOWN - found)}"
