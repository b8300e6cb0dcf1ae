"""The ``instr`` command line: a click group whose sub-commands live in ``llamacpp_instr.commands``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass

import click

from llamacpp_instr import commands
from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.version import __version__

# the help's groups, by job, and the commands of each in the order the help lists them
GROUPS: dict[str, tuple[str, ...]] = {
    "Run a model": ("run", "serve", "exec", "replay"),
    "Read a log": (
        "summary",
        "requests",
        "experts",
        "compare",
        "to-perfetto",
        "export",
        "follow",
    ),
    "Decide the next run": ("fit", "plan", "predict", "peaks"),
    "Quantize": ("quantize", "quant-eval", "quant-sweep", "quant-report"),
    "Set up": ("doctor", "build"),
}


@dataclass(frozen=True)
class Alias:
    """An old command name, answered for one release by the command that replaces it: ``instr
    OLD ARGS`` runs ``instr COMMAND DEFAULTS OPTION ARGS``, or, where the old name took its own
    required option ``given_as`` for ``option``, ``instr COMMAND DEFAULTS ARGS`` with ``given_as``
    spelled ``option``."""

    command: str  # the command that answers
    option: str  # the command's option that the old name stands for
    given_as: str | None = None  # the old name's required option that ``option`` replaces
    defaults: tuple[str, ...] = ()  # the old name's own defaults, where the command's differ

    @property
    def form(self) -> str:
        """The form that replaces the old name: ``instr export --otlp``."""
        return f"instr {self.command} {self.option}"

    def arguments(self, args: list[str]) -> list[str]:
        """The old name's ``args``, as the command reads them."""
        if self.given_as is None:
            return [*self.defaults, self.option, *args]
        renamed = [self._renamed(a) for a in args]
        if renamed == args and not {"-h", "--help"} & set(args):
            raise click.UsageError(f"{self.given_as} is required")
        return [*self.defaults, *renamed]

    def _renamed(self, arg: str) -> str:
        name, eq, value = arg.partition("=")
        return f"{self.option}{eq}{value}" if name == self.given_as else arg


# old command names, answered for one release (hidden from the help) by the command that replaces
# them; no module of commands/ holds them
OLD_NAMES: dict[str, Alias] = {
    "metrics": Alias("follow", "--prometheus", given_as="--listen", defaults=("--wait", "0")),
    "to-otlp": Alias("export", "--otlp", given_as="--endpoint"),
    "workloads": Alias("export", "--workloads"),
    "tools": Alias("doctor", "--tools"),
    "demo": Alias("doctor", "--demo"),
}


def old_name_note(name: str) -> str:
    """The note an old command name prints on stderr before it runs."""
    form = OLD_NAMES[name].form
    return f"warning: instr {name} is now {form}; the old name goes in the next release"


class _Group(click.Group):
    """Bad input of any kind ends in one line, ``error: ...``, and exit status 2 (never a traceback):
    our own ``UserError`` as well as click's usage errors (unknown option, bad value...).

    The help lists the commands in ``GROUPS``; an old name (``OLD_NAMES``) runs the command that
    replaces it, after a note on stderr."""

    def main(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)  # type: ignore[arg-type,call-overload]
        except UserError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(
                getattr(exc, "exit_status", 2)
            )  # 3: out of memory (llamacpp_instr.running.memory_budget)
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

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for names in GROUPS.values() for name in names]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return command_named(cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        alias = OLD_NAMES.get(args[0]) if args else None
        if alias is not None:
            click.echo(old_name_note(args[0]), err=True)
            args = [alias.command, *alias.arguments(args[1:])]
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands by group, each with its one-line help, condensed here (``short_help``)
        rather than by click, whose condensing changed in 8.5: the help and docs/cli.md read the
        same with any click the package allows."""
        listed = all_commands()
        limit = formatter.width - 6 - max(len(name) for name in self.list_commands(ctx))
        for title, names in GROUPS.items():
            rows = [(n, listed[n]) for n in names if n in listed and not listed[n].hidden]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(
                        [(n, c.short_help or short_help(c.help or "", limit)) for n, c in rows]
                    )


def short_help(text: str, limit: int) -> str:
    """The first sentence of a command's help, cut at a word to ``limit`` characters with "..."
    (as click up to 8.4 made it)."""
    words = text.partition("\n\n")[0].split()
    if words and words[0] == "\b":
        words = words[1:]
    total = 0
    for i, word in enumerate(words):
        total += len(word) + (i > 0)
        if total > limit:
            break
        if word.endswith("."):
            return " ".join(words[: i + 1])
        if total == limit and i != len(words) - 1:
            break
    else:
        return " ".join(words)
    total += len("...")
    while i > 0:
        total -= len(words[i]) + (i > 0)
        if total <= limit:
            break
        i -= 1
    return " ".join(words[:i]) + "..."


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="instr")
def main() -> None:
    """See inside a real llama.cpp run.

    Run a model with instrumentation (`instr run`), then turn the NDJSON session log into a
    Perfetto trace, summaries or quantization reports.
    """


# the modules of llamacpp_instr/commands, listed without importing them
_MODULES = frozenset(info.name for info in pkgutil.iter_modules(commands.__path__))


def command_named(name: str) -> click.Command | None:
    """The sub-command ``name``, or None: the ``command`` of ``commands/<name with _ for ->.py``,
    imported on first use, so that ``instr summary`` loads what summary needs and not what every
    other command's options import (numpy, the bindings...)."""
    module = name.replace("-", "_")
    if module not in _MODULES:
        return None
    command = getattr(importlib.import_module(f"{commands.__name__}.{module}"), "command", None)
    return command if isinstance(command, click.Command) and command.name == name else None


def all_commands() -> dict[str, click.Command]:
    """Every sub-command by name (each module imported: the help, the docs, the tests)."""
    found = (command_named(module.replace("_", "-")) for module in sorted(_MODULES))
    return {command.name: command for command in found if command is not None and command.name}


if __name__ == "__main__":
    main()
