"""The ``instr`` command line: a click group whose sub-commands live in ``llamacpp_instr.commands``."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

from llamacpp_instr import __version__, commands
from llamacpp_instr.converters.errors import UserError


class _Group(click.Group):
    """Bad input of any kind ends in one line, ``error: ...``, and exit status 2 (never a traceback):
    our own ``UserError`` as well as click's usage errors (unknown option, bad value...)."""

    def main(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)  # type: ignore[arg-type,call-overload]
        except UserError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(getattr(exc, "exit_status", 2))  # 3: out of memory (llamacpp_instr.memory)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
            click.echo(f"error: {exc.format_message()}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        # standalone_mode=False returns the exit code of --help/--version (ctx.exit) instead
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="instr")
def main() -> None:
    """See inside a real llama.cpp run.

    Run a model with instrumentation (`instr run`), then turn the NDJSON session log into a
    Perfetto trace, summaries or quantization reports.
    """


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        command = getattr(module, "command", None)
        if isinstance(command, click.Command):
            main.add_command(command)


_register_commands()

if __name__ == "__main__":
    main()
