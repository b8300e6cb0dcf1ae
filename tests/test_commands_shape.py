"""Commands are front doors: ``llamacpp_instr/commands/`` holds exactly the commands the help lists,
one module each, and each parses its options, calls one library function and renders the result.

Walks the package with ``ast`` (nothing is imported): every module of ``commands/`` defines
``command``, a click command named for its file and listed in ``cli.GROUPS``; no command invokes
another (no ``invoke`` call, no import of another command's module); no command function's body,
its docstring aside, is over 40 lines; and outside ``commands/`` only ``cli.py`` imports a module of
``commands/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from llamacpp_instr import cli

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1] / "llamacpp_instr"
COMMANDS = ROOT / "commands"
MAX_BODY_LINES = 40


def command_modules() -> dict[str, ast.Module]:
    found = {
        p.stem: ast.parse(p.read_text(encoding="utf-8"))
        for p in sorted(COMMANDS.glob("*.py"))
        if p.name != "__init__.py"
    }
    assert len(found) >= 15, f"only {len(found)} modules under {COMMANDS}"
    return found


def declared_name(function: ast.FunctionDef) -> str | None:
    """The name a ``@click.command("name", ...)`` decorator gives ``function``, or None."""
    for d in function.decorator_list:
        if (
            isinstance(d, ast.Call)
            and isinstance(d.func, ast.Attribute)
            and d.func.attr == "command"
            and isinstance(d.func.value, ast.Name)
            and d.func.value.id == "click"
            and d.args
            and isinstance(d.args[0], ast.Constant)
        ):
            return str(d.args[0].value)
    return None


def commands_of(tree: ast.Module) -> list[ast.FunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and declared_name(n)]


def body_lines(function: ast.FunctionDef) -> int:
    """The lines of a function's body from its first statement after the docstring to its end."""
    body = function.body
    if (
        isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    if not body:
        return 0
    return body[-1].end_lineno - body[0].lineno + 1  # type: ignore[operator]


def invokes(tree: ast.AST) -> list[int]:
    """The lines of each ``invoke(...)`` or ``x.invoke(...)`` call (click's ``Context.invoke``)."""
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Attribute) and n.func.attr == "invoke")
            or (isinstance(n.func, ast.Name) and n.func.id == "invoke")
        )
    ]


def imports_commands(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of each import of ``llamacpp_instr.commands`` or a module of it."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and not n.level:
            if n.module == "llamacpp_instr.commands" or n.module.startswith(
                "llamacpp_instr.commands."
            ):
                found.append((n.lineno, n.module))
            elif n.module == "llamacpp_instr" and any(a.name == "commands" for a in n.names):
                found.append((n.lineno, "llamacpp_instr.commands"))
        elif isinstance(n, ast.Import):
            found += [
                (n.lineno, a.name)
                for a in n.names
                if a.name == "llamacpp_instr.commands"
                or a.name.startswith("llamacpp_instr.commands.")
            ]
    return found


def test_every_module_of_commands_is_one_listed_command() -> None:
    listed = {name for names in cli.GROUPS.values() for name in names}
    wrong = []
    for stem, tree in command_modules().items():
        names = [declared_name(f) for f in commands_of(tree)]
        top = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        if names != [stem.replace("_", "-")] or "command" not in top:
            wrong.append(f"{stem}.py defines {names or 'no command'}")
        elif names[0] not in listed:
            wrong.append(f"{stem}.py: instr {names[0]} is not in cli.GROUPS (an old name?)")
    assert not wrong, "\n".join(wrong)
    assert {s.replace("_", "-") for s in command_modules()} == listed


def test_no_command_invokes_another() -> None:
    found = []
    for stem, tree in command_modules().items():
        found += [f"commands/{stem}.py:{line}: invoke" for line in invokes(tree)]
        found += [f"commands/{stem}.py:{line}: imports {m}" for line, m in imports_commands(tree)]
    assert not found, "\n".join(found)


def test_no_command_body_over_40_lines() -> None:
    sizes = {
        f"{stem}.py:{f.name}": body_lines(f)
        for stem, tree in command_modules().items()
        for f in commands_of(tree)
    }
    assert len(sizes) >= 15 and max(sizes.values()) > 10  # the walk measures what it lists
    over = {name: n for name, n in sizes.items() if n > MAX_BODY_LINES}
    assert not over, f"command bodies over {MAX_BODY_LINES} lines: {over}"


def test_only_the_cli_imports_the_commands() -> None:
    found = []
    checked = 0
    for p in sorted(ROOT.rglob("*.py")):
        if p.parent == COMMANDS or p == ROOT / "cli.py":
            continue
        checked += 1
        tree = ast.parse(p.read_text(encoding="utf-8"))
        found += [f"{p.relative_to(ROOT)}:{line}: {m}" for line, m in imports_commands(tree)]
    assert checked > 150, f"only {checked} modules checked"
    assert not found, "\n".join(found)


def test_the_checks_can_fail() -> None:
    """Each check catches what it is for, on code written to break it."""
    text = '''
import click
from llamacpp_instr.commands.follow import command as other

@click.command("x")
def command(ctx):
    """Help."""
    ctx.invoke(other)
''' + "    pass\n" * 40
    tree = ast.parse(text)
    (function,) = commands_of(tree)
    assert declared_name(function) == "x"
    assert body_lines(function) == 41
    assert invokes(tree) == [8]
    assert imports_commands(tree) == [(3, "llamacpp_instr.commands.follow")]
    assert imports_commands(ast.parse("from llamacpp_instr import commands\n")) == [
        (1, "llamacpp_instr.commands")
    ]
    assert not commands_of(ast.parse("def command():\n    pass\n"))
