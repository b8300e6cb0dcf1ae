"""No function of the overlay's native sources over 80 lines, as no function of the package is.

Every ``patches/overlay/**/*.{cpp,h,cu,cuh}`` is read without its comments, string literals and
preprocessor lines, and walked brace by brace: a brace at namespace or class scope whose head ends
a parameter list (``) {``, ``) const {``, ``) : member(x) {``, ``-> T {``) opens a function's
body; one after ``namespace``, ``extern "C"``, ``struct``, ``class`` or ``union`` opens a scope
whose functions are measured in turn; any other (an initializer, an enum) is skipped whole. A
function's lines run from the line of its name to the line of its closing brace, both counted,
its comments and blank lines with them (Python's ``lineno`` to ``end_lineno``). Lambdas and local
classes are their function's lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

OVERLAY = Path(__file__).resolve().parents[1] / "patches" / "overlay"
SUFFIXES = {".cpp", ".h", ".cu", ".cuh"}
MAX_FUNCTION_LINES = 80

_SCOPE = re.compile(r"\b(?:namespace|extern\s*\"\s*\"|struct|class|union)\b")
# what may follow a parameter list before the body: qualifiers, a trailing return type, or a
# constructor's initializer list
_AFTER_PARAMS = re.compile(
    r"\)\s*(?:(?:const|noexcept|override|final|mutable|volatile|&&?)\s*|->\s*[\w:<>,*&\s]+)*$"
)
_INIT_LIST = re.compile(r"\)\s*(?:noexcept\s*)?:(?!:)[^;]*\)$")
_NOT_A_NAME = {
    "__attribute__",
    "alignas",
    "decltype",
    "__declspec",
    "sizeof",
    "if",
    "for",
    "while",
    "switch",
    "return",
}
_NAME = re.compile(r"(operator\s*(?:\(\)|[^\s(]+)|~?[A-Za-z_]\w*)\s*$")


def _blank(m: re.Match[str]) -> str:
    """The match as spaces, its newlines kept (so that lines keep their numbers)."""
    return re.sub(r"[^\n]", " ", m.group(0))


def _literal(m: re.Match[str]) -> str:
    """A comment as spaces; a string or character literal as its quotes around spaces."""
    s = m.group(0)
    if s[0] in "\"'":
        return s[0] + " " * (len(s) - 2) + s[-1]
    return _blank(m)


def code(text: str) -> str:
    """The source without comments, literals' contents and preprocessor lines, lines kept."""
    text = re.sub(
        r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', _literal, text, flags=re.S
    )
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", _blank, text, flags=re.M)


def _name(head: str) -> tuple[str, int] | None:
    """The function's name and where it stands in HEAD (the text before a brace), when HEAD ends a
    parameter list. The parameter list is the first parenthesis at HEAD's top level that follows a
    name (``__attribute__((...))`` and its like are skipped whole)."""
    head = head.rstrip()
    if not (_AFTER_PARAMS.search(head) or _INIT_LIST.search(head)):
        return None
    call = re.search(r"\boperator\s*\(\s*\)\s*\(", head)
    if call:
        return "operator()", call.start()
    depth = 0
    for i, c in enumerate(head):
        if c == "(":
            found = _NAME.search(head[:i]) if depth == 0 else None
            if found and found.group(1) not in _NOT_A_NAME:
                return re.sub(r"\s+", " ", found.group(1)), found.start(1)
            depth += 1
        elif c == ")":
            depth -= 1
    return None


def functions(text: str) -> list[tuple[str, int, int]]:
    """Each function defined in TEXT: its name, the line of its name, the line of its end."""
    src = code(text)
    found: list[tuple[str, int, int]] = []
    head_start = 0
    i = 0
    while i < len(src):
        c = src[i]
        if c in ";}":
            head_start = i + 1
        elif c == "{":
            head = src[head_start:i]
            close = _matching(src, i)
            named = _name(head)
            if named is not None:
                line = src.count("\n", 0, head_start + named[1]) + 1
                found.append((named[0], line, src.count("\n", 0, close) + 1))
                i = close
            elif not _SCOPE.search(head) or re.search(r"\benum\b|=", head):
                i = close  # an initializer or an enum: nothing of it is a function
            head_start = i + 1
        i += 1
    return found


def _matching(src: str, at: int) -> int:
    """The index of the brace that closes the one at AT."""
    depth = 0
    for j in range(at, len(src)):
        if src[j] == "{":
            depth += 1
        elif src[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise AssertionError(f"unbalanced braces from offset {at}")


def overlay_sizes() -> dict[str, int]:
    """Every overlay function, as ``path:line name``, and its lines."""
    sizes: dict[str, int] = {}
    for path in sorted(OVERLAY.rglob("*")):
        if path.suffix not in SUFFIXES:
            continue
        rel = path.relative_to(OVERLAY)
        for name, first, last in functions(path.read_text(encoding="utf-8")):
            sizes[f"{rel}:{first} {name}"] = last - first + 1
    return sizes


SAMPLE = """\
// a comment with a brace {
namespace a {
static const char * names[] = { "x{", "y" };
struct s {
    s(int v) : v(v) {}
    int get() const {
        return v;
    }
    int v;
};
enum class e { one, two };
template <typename T>
__attribute__((target("avx"))) static T twice(T x) {
    auto f = [&](T y) {
        return y + x;
    };
#define NOT_CODE {
    return f(x);
}
}  // namespace a
extern "C" int
c_entry(int n) noexcept {
    if (n) {
        return 1;
    }
    return 0;
}
"""


def test_the_measure_finds_functions_and_their_lines() -> None:
    """Functions at namespace and class scope, their lines from the name to the closing brace."""
    assert functions(SAMPLE) == [
        ("s", 5, 5),
        ("get", 6, 8),
        ("twice", 13, 19),
        ("c_entry", 22, 27),
    ]


def test_the_overlay_is_measured() -> None:
    """The walk finds the overlay's functions (a broken walk would find none over the limit)."""
    sizes = overlay_sizes()
    assert len(sizes) > 500
    names = {k.split(" ", 1)[1] for k in sizes}
    assert {"llama_instr_decode_end", "llama_instr_encode_end", "compute_end"} <= names


def test_no_overlay_function_over_80_lines() -> None:
    """The overlay's functions divide where they divide: none over 80 lines."""
    over = {k: n for k, n in overlay_sizes().items() if n > MAX_FUNCTION_LINES}
    listed = "\n".join(f"  {n:4d} {k}" for k, n in sorted(over.items(), key=lambda kv: -kv[1]))
    assert not over, f"{len(over)} overlay functions over {MAX_FUNCTION_LINES} lines:\n{listed}"


if __name__ == "__main__":  # the sizes, largest first
    for key, n in sorted(overlay_sizes().items(), key=lambda kv: -kv[1]):
        print(n, key)
