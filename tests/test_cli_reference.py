"""The README's CLI reference is the click help, verbatim."""

from pathlib import Path

from llamacpp_instr import cli_reference


def test_readme_cli_reference_is_current() -> None:
    readme = Path(cli_reference.REPO_ROOT) / "README.md"
    text = readme.read_text()
    assert (
        cli_reference.updated_readme(text) == text
    ), "README.md is out of date: run python -m llamacpp_instr.cli_reference --write"


def test_every_command_has_help() -> None:
    for name, cmd in cli_reference.main.commands.items():
        assert cmd.help and len(cmd.help.strip()) > 20, name
