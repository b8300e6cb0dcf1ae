"""`instr` imports only the command it runs.

The image's builder stage (docker/Dockerfile) installs click alone beside the package to run
`instr build`, and each `instr` a user or a test starts pays for the imports of the command it runs,
not for every command's (numpy, orjson, pandas, the bindings).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys

import click
import pytest

from llamacpp_instr import commands as command_modules
from llamacpp_instr.cli import all_commands, command_named

pytestmark = pytest.mark.fast

# what importing the CLI and ``body`` loaded from outside the standard library (after what the
# interpreter's start loaded: site's .pth files)
_THIRD_PARTY = """
import json, sys
before = set(sys.modules)
import llamacpp_instr.cli as cli
{body}
new = {{m.split(".")[0] for m in set(sys.modules) - before}}
print(json.dumps(sorted(new - set(sys.stdlib_module_names))))
"""


def third_party_after(body: str) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-c", _THIRD_PARTY.format(body=body)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    names: list[str] = json.loads(r.stdout)
    return names


def test_instr_build_needs_click_alone() -> None:
    # the command, and what it imports when it runs (the build, and the programs' build)
    body = 'cli.command_named("build")\nimport llamacpp_instr.native.build_request, llamacpp_instr.native.tools'
    assert third_party_after(body) == ["click", "llamacpp_instr"]


def test_the_help_still_imports_every_command_and_so_can_fail() -> None:
    # the check above sees an eager import: listing the commands loads numpy (running/memory_budget.py)
    assert "numpy" in third_party_after("cli.all_commands()")


def test_every_command_is_found_by_its_name() -> None:
    commands = all_commands()
    assert len(commands) >= 18 and "to-perfetto" in commands and "quant-eval" in commands
    for name, command in commands.items():
        assert command_named(name) is command
    # a shared module's name, an old name (an alias) and a module's own spelling are not commands
    assert command_named("tensor-options") is None and command_named("quant_eval") is None
    assert command_named("to-otlp") is None
    assert isinstance(command_named("summary"), click.Command)
    # the lookup goes by the module's name: a command named otherwise would be lost, so each
    # module's command is named for it
    for module in (info.name for info in pkgutil.iter_modules(command_modules.__path__)):
        imported = importlib.import_module(f"{command_modules.__name__}.{module}")
        command = getattr(imported, "command", None)
        if isinstance(command, click.Command):
            assert commands[module.replace("_", "-")] is command, module
