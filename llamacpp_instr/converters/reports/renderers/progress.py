"""Progress drawn on a terminal while a long command works: one line, redrawn in place."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

WIDTH = 24  # the bar's characters


def chunks_bar(out: TextIO | None = None) -> Callable[[int, int, int, int, Path], None]:
    """``instr quant-eval``'s bar: chunks done of the total, and the model being evaluated (a
    ``running.quant.evaluate.Progress``), on ``out`` (stderr)."""

    def show(chunk: int, n_chunks: int, model: int, n_models: int, path: Path) -> None:
        stream = out if out is not None else sys.stderr
        if chunk >= n_chunks:
            stream.write(f"\r\x1b[Kquant-eval: {n_chunks}/{n_chunks} chunks done\n")
            stream.flush()
            return
        done = (chunk * n_models + model) / max(1, n_chunks * n_models)
        bar = f"{'#' * int(done * WIDTH):<{WIDTH}}"
        role = "base" if model == 0 else f"quant {model}/{n_models - 1}"
        stream.write(
            f"\r\x1b[Kquant-eval [{bar}] chunk {chunk + 1}/{n_chunks} · {role} {path.name}"
        )
        stream.flush()

    return show


@contextmanager
def replay_bar(name: str, total: int) -> Iterator[Callable[[bool], None]]:
    """``instr replay``'s bar on stderr, one per setting: the requests answered of those to send,
    and how many failed; nothing where stderr is no terminal."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    failed = 0
    columns = (
        TextColumn("replay {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, disable=not console.is_terminal) as bar:
        task = bar.add_task(name, total=total, failed=0)

        def tick(ok: bool) -> None:
            nonlocal failed
            failed += not ok
            bar.update(task, advance=1, failed=failed)

        yield tick
