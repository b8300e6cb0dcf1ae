"""Comments and docstrings state the present and say why; history lives in commit messages.

Every ``.py`` under ``llamacpp_instr/`` is read with :mod:`tokenize` (its ``#`` comments and the
strings that stand alone as a statement: docstrings, and bare strings used as comments), and every
file under ``patches/overlay/`` with a scan of its ``//`` and ``/* */`` comments (string and
character literals skipped). A comment fails on:

- **our issue numbers**: ``issue 12``, ``issue #12``, ``issues 12 and 13`` (any case). llama.cpp's,
  ggml's or llama-cpp-python's own threads cited as the reason for a workaround are references, not
  history, and pass: the word before the number names the project (``llama.cpp #20824``,
  ``ggml issue 1234``, ``upstream issue 99``). A bare ``#12`` fails unless a project's name or
  ``PR`` comes right before it.
- **"used to"** as history ("the flag used to be on"). The phrase passes only as a passive of
  purpose, after a form of *be* or *get* with at most one word between (``is used to pick``,
  ``are only used to size``): every other "used to" reads as history or is ambiguous between
  the two ("the value used to compute X"), and is written without it (``the value X is computed
  from``, ``for``).
- **"as before"**, whatever follows: it points at a past state of the code.
- **dated figures**: a year and month (``2026-03``, ``2026-03-14``; one inside a path or URL,
  right after ``/``, passes: ``draft/2020-12/schema``), or a month named with a year
  (``March 2026``, ``in Mar. 2026``, ``March 14, 2026``). Figures live in ``docs/performance.md``
  with how to rerun them.

``OVERLAY_ALLOWED`` lists the native overlay's hits that are not swept yet, by file and the
comment line's text (line numbers move under edits). It only shrinks: an entry that no longer
matches a hit fails too, so that a sweep removes its entry.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "llamacpp_instr"
OVERLAY = ROOT / "patches" / "overlay"

_MONTHS = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)"
)

RULES: dict[str, re.Pattern[str]] = {
    "issue number": re.compile(r"(?:\bissues?\s+#?|(?<![\w&])#)\d+\b", re.IGNORECASE),
    "used to (history)": re.compile(r"\bused to\b", re.IGNORECASE),
    "as before": re.compile(r"\bas before\b", re.IGNORECASE),
    "dated figure": re.compile(
        r"(?<![/\w-])(?:19|20)\d\d-(?:0[1-9]|1[0-2])(?!\d)"
        rf"|\b{_MONTHS}\.?\s+(?:\d{{1,2}},?\s+)?(?:19|20)\d\d\b"
    ),
}

# What may come right before a hit that is then no hit: another project's name (or PR) before a
# thread's number; a form of "be" or "get", with at most one word between, before "used to".
EXCUSED_BY: dict[str, re.Pattern[str]] = {
    "issue number": re.compile(
        r"\b(?:llama\.cpp|ggml|gguf|llama-cpp-python|upstream)(?:'s)?(?:\s+PRs?)?\s+$"
        r"|\bPRs?\s+$",
        re.IGNORECASE,
    ),
    "used to (history)": re.compile(
        r"\b(?:is|are|was|were|be|been|being|get|gets|got)\s+(?:\w+\s+)?$", re.IGNORECASE
    ),
}

# The overlay's hits not swept yet: (path under patches/overlay/, the comment line's text, stripped).
OVERLAY_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def hits_in(text: str) -> list[tuple[int, str]]:
    """(offset, rule) of each phrase in ``text`` that the module docstring rules out."""
    found: list[tuple[int, str]] = []
    for rule, pattern in RULES.items():
        for match in pattern.finditer(text):
            excuse = EXCUSED_BY.get(rule)
            if excuse is not None and excuse.search(text, 0, match.start()):
                continue
            found.append((match.start(), rule))
    return sorted(found)


def python_comments(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each comment and each string standing alone as a statement."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    quiet = {tokenize.NL, tokenize.COMMENT}
    at_start = True
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
            i += 1
            continue
        if tok.type == tokenize.STRING and at_start:
            j = i
            while j < len(tokens) and tokens[j].type in quiet | {tokenize.STRING}:
                j += 1
            if j == len(tokens) or tokens[j].type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                for k in range(i, j):
                    if tokens[k].type == tokenize.STRING:
                        yield tokens[k].start[0], tokens[k].string
                    elif tokens[k].type == tokenize.COMMENT:
                        yield tokens[k].start[0], tokens[k].string
                i = j
                continue
        if tok.type not in quiet:
            at_start = tok.type in (
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENCODING,
            ) or (tok.type == tokenize.OP and tok.string == ";")
        i += 1


def c_comments(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of each ``//`` and ``/* */`` comment; literals are skipped."""
    i, line, n = 0, 1, len(source)
    while i < n:
        c = source[i]
        if c == "\n":
            line += 1
            i += 1
        elif source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            yield line, source[i:end]
            i = end
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            end = n if end < 0 else end + 2
            yield line, source[i:end]
            line += source.count("\n", i, end)
            i = end
        elif c in "\"'" and not (c == "'" and i > 0 and source[i - 1].isalnum()):
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            i = j + 1
        else:
            i += 1


def located(comments: Iterator[tuple[int, str]]) -> list[tuple[int, str, str]]:
    """(line, rule, that line's text) of each hit in ``comments``."""
    out = []
    for first_line, text in comments:
        lines = text.split("\n")
        for offset, rule in hits_in(text):
            k = text.count("\n", 0, offset)
            out.append((first_line + k, rule, lines[k].strip()))
    return out


def findings(path: Path, comments: Iterator[tuple[int, str]]) -> list[tuple[str, int, str, str]]:
    """(path, line, rule, that line's text) of each hit in ``comments``."""
    name = str(path.relative_to(ROOT))
    return [(name, line, rule, text) for line, rule, text in located(comments)]


def package_findings() -> list[tuple[str, int, str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        out += findings(path, python_comments(path.read_text(encoding="utf-8")))
    return out


def overlay_findings() -> list[tuple[str, int, str, str]]:
    out = []
    for path in sorted(p for p in OVERLAY.rglob("*") if p.is_file()):
        if path.suffix in (".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".m", ".mm"):
            out += findings(path, c_comments(path.read_text(encoding="utf-8")))
    return out


def _report(hits: list[tuple[str, int, str, str]]) -> str:
    return "\n".join(f"{p}:{n}: {rule}: {text}" for p, n, rule, text in hits)


def test_package_comments_state_the_present() -> None:
    hits = package_findings()
    assert not hits, "history in comments or docstrings:\n" + _report(hits)


def test_overlay_comments_state_the_present() -> None:
    hits = overlay_findings()
    prefix = str(OVERLAY.relative_to(ROOT)) + "/"
    keyed = {(p.removeprefix(prefix), text) for p, _, _, text in hits}
    new = [h for h in hits if (h[0].removeprefix(prefix), h[3]) not in OVERLAY_ALLOWED]
    assert not new, "history in the overlay's comments:\n" + _report(new)
    stale = sorted(OVERLAY_ALLOWED - keyed)
    assert not stale, f"OVERLAY_ALLOWED entries that match nothing (remove them): {stale}"


@pytest.mark.parametrize(
    "text",
    [
        "# see issue 52 §3",
        "# (Issue #12)",
        "# issues 12 and 13",
        "# fixed in #67",
        "# the flag used to be on",
        "# the value used to compute the mean",
        "# laid out as before",
        "# measured 2026-11-26: 0.175",
        "# 82 % of the cells (2026-11)",
        "# in March 2026 the ratio was 1.4",
        "# on Nov. 26, 2026",
    ],
)
def test_a_history_comment_fails(text: str) -> None:
    assert hits_in(text), text


@pytest.mark.parametrize(
    "text",
    [
        "# llama.cpp #20824 frees the buffer twice, so the copy is kept",
        "# ggml issue 1234: the scheduler reorders splits",
        "# upstream PR #9000 renamed the field",
        "# the id is used to key the table",
        "# the sizes are only used to pick a placement",
        "# schema: https://json-schema.org/draft/2020-12/schema",
        "# colour #59a14f",
        "# before the first step, as the log records it",
        "# the reissue 3 times",
    ],
)
def test_a_present_comment_passes(text: str) -> None:
    assert not hits_in(text), (text, hits_in(text))


def test_python_scan_reads_comments_and_docstrings_only() -> None:
    source = (
        '"""Module docstring, issue 7."""\n'
        "x = 'issue 8 in a string is data'\n"
        "def f():\n"
        "    '''as before'''\n"
        "    return 1  # used to be 2\n"
        "y = ('issue 9'\n"
        "     'issue 10')\n"
    )
    got = [(line, rule) for line, rule, _ in located(python_comments(source))]
    assert got == [(1, "issue number"), (4, "as before"), (5, "used to (history)")]


def test_c_scan_reads_comments_only() -> None:
    source = (
        'const char * s = "issue 7 // as before";\n'
        "char q = '\"'; // used to be 3\n"
        "/* a block\n"
        "   measured 2026-03 */ int x = 1'000;\n"
    )
    got = [(line, rule) for line, rule, _ in located(c_comments(source))]
    assert got == [(2, "used to (history)"), (4, "dated figure")]
