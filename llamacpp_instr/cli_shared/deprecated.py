"""Old spellings of options, kept for one release with a note on stderr."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from llamacpp_instr.cli_shared.options import output_type

F = TypeVar("F", bound=Callable[..., Any])


def deprecated_alias(old: str, new: str, dest: str, **option: Any) -> Callable[[F], F]:
    """The old spelling ``old`` of the option ``new`` (parameter ``dest``), kept for one release:
    hidden from the help, it sets ``dest`` as ``new`` would, with a deprecation note on stderr.
    ``option`` holds its click settings (type, multiple...), the same as ``new``'s."""
    hidden = "deprecated_" + old.lstrip("-").replace("-", "_")

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(hidden)
            if value is None or value == ():
                return f(*args, **kwargs)
            click.echo(
                f"warning: {old} is deprecated and will be removed in the next release; "
                f"use {new}",
                err=True,
            )
            source = click.get_current_context().get_parameter_source(dest)
            if source is ParameterSource.COMMANDLINE:
                raise click.UsageError(f"{old} is the old spelling of {new}: give one of them")
            kwargs[dest] = value
            return f(*args, **kwargs)

        return click.option(old, hidden, hidden=True, default=None, **option)(wrapper)  # type: ignore[return-value]

    return deco


def chunk_size_options(f: F) -> F:
    """``--chunk-size``, the tokens per chunk of quant-eval and quant-sweep (llama-perplexity's -c),
    and its old spelling ``--ctx``, which means the context size everywhere else."""
    f = deprecated_alias("--ctx", "--chunk-size", "chunk_size", type=click.IntRange(min=8))(f)
    return click.option(
        "--chunk-size",
        type=click.IntRange(min=8),
        default=512,
        show_default=True,
        help="Tokens per chunk (llama-perplexity's -c); the second half of each is scored.",
    )(f)


# ``--out``: run's and serve's old spelling of -o/--output (the session log)
out_alias = deprecated_alias("--out", "-o/--output", "output", type=output_type())
# ``--out-dir``: export's and doctor --demo's old spelling of -o/--output (a directory)
out_dir_alias = deprecated_alias("--out-dir", "-o/--output", "output", type=output_type(True))
