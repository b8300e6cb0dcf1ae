"""The CLI reference (docs/cli.md) is the click help, verbatim."""

import pytest

from llamacpp_instr import cli_reference
from llamacpp_instr.cli import all_commands

pytestmark = pytest.mark.fast


def test_cli_reference_is_current() -> None:
    text = cli_reference.PAGE.read_text()
    assert cli_reference.BEGIN in text and "## `instr to-perfetto`" in text  # not vacuous
    assert (
        cli_reference.updated(text) == text
    ), "docs/cli.md is out of date: run python -m llamacpp_instr.cli_reference --write"


def test_every_command_has_help() -> None:
    for name, cmd in all_commands().items():
        assert cmd.help and len(cmd.help.strip()) > 20, name
