"""A kind of compute is told apart in one place: the fold.

An encoder's encode (an image's or a sound's, through mtmd's projector) is no decode step: the
fold opens a ``media.Encode`` for its ``step_begin`` and hands it out as an ``EncodeDone``, beside
the decode steps' ``StepDone``, so that a reader of decode steps never sees one and needs no guard
to keep it out of its figures. Outside the fold, only the media views (the modules named for
media: the record decoder that says which ``step_begin`` is an encode, the encodes' tables,
tracks and reports) may compare a step's kind with ``"encode"``; a comparison anywhere else is a
guard the next kind of compute would need again, and one missed guard counts it as a token.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import llamacpp_instr

pytestmark = pytest.mark.fast

PACKAGE = Path(llamacpp_instr.__file__).resolve().parent
FOLD = "converters/session/fold.py"

# each way a module may compare a kind with "encode" (the value, or the name ``ENCODE``)
CAUGHT = (
    'if step.kind == "encode":\n    pass',
    'ph = "t" if it.args.get("kind") != "encode" else "s"',
    'kind = kind if kind in ("gen", "encode") else "prompt"',
    "if s.kind == ENCODE:\n    pass",
    "if s.kind == media.ENCODE:\n    pass",
    'encodes = steps[steps["kind"].isin(["encode"])]',
    'match kind:\n    case "encode":\n        pass',
)
# what names an encode without comparing a kind with it
LET_BE = (
    'args = {"step": 1, "kind": "encode"}',
    'unrecorded = h["encode"].sum()',
    'if name == "encoder":\n    pass',
    "self.encode.observe(fig.dur_s)",
    '"""An encode (kind "encode")."""',
)


def _names_encode(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "encode"
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_encode(e) for e in node.elts)
    if isinstance(node, ast.Name):
        return node.id == "ENCODE"
    if isinstance(node, ast.Attribute):
        return node.attr == "ENCODE"
    return False


def encode_comparisons(tree: ast.AST) -> list[int]:
    """The lines where ``tree`` compares something with "encode" (``==``, ``!=``, ``in``, pandas'
    ``isin``, a ``match`` case)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            hit = any(_names_encode(o) for o in [node.left, *node.comparators])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hit = node.func.attr == "isin" and any(_names_encode(a) for a in node.args)
        elif isinstance(node, ast.MatchValue):
            hit = _names_encode(node.value)
        else:
            continue
        if hit:
            lines.append(node.lineno)
    return sorted(lines)


def may_tell_encodes_apart(rel: str) -> bool:
    """The fold, and the media views (the modules named for media)."""
    return rel == FOLD or "media" in Path(rel).stem


def comparisons_outside(package: Path) -> dict[str, list[int]]:
    """Per module of ``package`` that may not, the lines where it compares a kind with
    "encode"."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if may_tell_encodes_apart(rel):
            continue
        lines = encode_comparisons(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            found[rel] = lines
    return found


@pytest.mark.parametrize("src", CAUGHT)
def test_a_comparison_with_encode_is_caught(src: str) -> None:
    assert encode_comparisons(ast.parse(src)) == [1 if "match" not in src else 2]


@pytest.mark.parametrize("src", LET_BE)
def test_naming_an_encode_is_no_comparison(src: str) -> None:
    assert encode_comparisons(ast.parse(src)) == []


def test_only_the_fold_and_the_media_views_tell_an_encode_from_a_step() -> None:
    assert (PACKAGE / FOLD).is_file()
    assert sum(1 for _ in PACKAGE.rglob("*.py")) > 200  # (the walk found the package)
    found = comparisons_outside(PACKAGE)
    assert not found, (
        "modules that compare a kind with 'encode' (a guard: read the fold's EncodeDone, or "
        f"its StepDone, instead): {found}"
    )
