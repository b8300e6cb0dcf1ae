"""Commands stay thin: each parses its options, calls one library function and renders the result
with the report renderers (``converters/reports/renderers/``).

Walks ``llamacpp_instr`` with ``ast`` (nothing is imported): no module outside the renderers pads
text to a width, the way a table is laid out by hand (``str.ljust``/``rjust``/``center``, or a width in a format spec: ``f"{x:>8}"``,
``f"{v:9.1f}"``, ``f"{s:<{w}}"``). A command's own size is held by its body, not its module
(``test_commands_shape``: at most 40 lines a body; its options take what they take).
"""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1] / "llamacpp_instr"
RENDERERS = ROOT / "converters" / "reports" / "renderers"

# a format spec that sets a width: [[fill]align][sign][z][#][0]width, the width a number or a field
_WIDTH = re.compile(r"^(.?[<>=^])?[+\- ]?z?#?0?([1-9]|\{)")
_PADDING = ("ljust", "rjust", "center")


def padding(text: str) -> list[tuple[int, str]]:
    """(line, what) of each padding to a width in a module's text."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _PADDING
        ):
            found.append((node.lineno, f".{node.func.attr}("))
        elif isinstance(node, ast.FormattedValue) and isinstance(node.format_spec, ast.JoinedStr):
            spec = "".join(
                str(v.value) if isinstance(v, ast.Constant) else "{}"
                for v in node.format_spec.values
            )
            if _WIDTH.match(spec):
                found.append((node.lineno, f":{spec}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
            and isinstance(node.func.value, ast.Constant)
            and isinstance(node.func.value.value, str)
        ):  # a str.format template: "{:>8}".format(x), "{0:<{1}}".format(x, w)
            specs = [s for _, _, s, _ in string.Formatter().parse(node.func.value.value) if s]
            found += [(node.lineno, f":{s}") for s in specs if _WIDTH.match(s)]
    return found


def test_no_text_table_is_laid_out_outside_the_renderers() -> None:
    checked = 0
    found = []
    for p in sorted(ROOT.rglob("*.py")):
        if RENDERERS in p.parents:
            continue
        checked += 1
        found += [f"{p.relative_to(ROOT)}:{n}: {what}" for n, what in padding(p.read_text())]
    assert checked > 150
    assert not found, "text padded to a width outside the renderers:\n" + "\n".join(found)


def test_the_renderers_pad_and_the_check_sees_it() -> None:
    """The text renderer lays tables out (the check is not blind), and each way of padding is
    caught while widthless formats pass."""
    assert padding((RENDERERS / "text.py").read_text())
    caught = [
        'x.ljust(8)', 'x.rjust(w)', 'x.center(9)', 'f"{x:>8}"', 'f"{x:<{w}}"', 'f"{v:9.1f}"',
        'f"{v:08.2f}"', '"{:>8}".format(x)', '"{0:<{1}}".format(x, w)', 'f"{x:*^12}"',
    ]  # fmt: skip
    for src in caught:
        assert padding(src), src
    passed = ['f"{v:.1f}"', 'f"{v:,d}"', 'f"{v:.0%}"', '"{:,.2f}".format(v)', 'f"{x!r}"', "'{}'"]
    for src in passed:
        assert not padding(src), src
