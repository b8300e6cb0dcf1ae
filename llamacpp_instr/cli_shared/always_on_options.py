"""What bounds a long session's cost and size (run, serve, exec): --sample, --sample-requests,
--max-bytes and --keep, given to the command as one ``always_on``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from llamacpp_instr.cli_shared.options import SizeParam
from llamacpp_instr.contract.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


def always_on_options(requests: bool = True) -> Callable[[F], F]:
    """What bounds a long session's cost and size (``llamacpp_instr.running.always_on``): --sample,
    --sample-requests (with ``requests``: the commands that serve requests), --max-bytes and
    --keep, given to the command as one ``always_on`` argument (an ``AlwaysOn``)."""
    from llamacpp_instr.running.always_on import MAX_SAMPLE

    options = [
        click.option(
            "--sample",
            type=click.IntRange(1, MAX_SAMPLE),
            default=1,
            show_default=True,
            help="Record one decode step in N at --level, the others at minimal (each step "
            "says its level; reports compute per-op figures from the sampled steps).",
        ),
        click.option(
            "--max-bytes",
            type=SizeParam(),
            default=None,
            help="Rotate the log at this size (bytes, or with a K, M or G suffix: 64M): LOG -> "
            "LOG.1 -> ..., each file starting with its own session_start.",
        ),
        click.option(
            "--keep",
            type=click.IntRange(1, 1000),
            default=None,
            help="Rotated files kept, LOG.1 .. LOG.K (default 8; needs --max-bytes).",
        ),
    ]
    if requests:
        options.insert(
            1,
            click.option(
                "--sample-requests",
                type=click.IntRange(1, MAX_SAMPLE),
                default=1,
                show_default=True,
                help="Record the steps of one request in N at --level, the others at minimal.",
            ),
        )

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from llamacpp_instr.running.always_on import AlwaysOn

            try:
                kwargs["always_on"] = AlwaysOn.of(
                    sample=kwargs.pop("sample"),
                    sample_requests=kwargs.pop("sample_requests", 1),
                    max_bytes=kwargs.pop("max_bytes") or 0,
                    keep=kwargs.pop("keep"),
                )
            except UserError as exc:
                raise click.UsageError(str(exc)) from None
            return f(*args, **kwargs)

        out: Any = wrapper
        for option in reversed(options):
            out = option(out)
        return out  # type: ignore[no-any-return]

    return deco
