"""``--experts`` of ``instr plan`` and ``instr fit``: a mixture of experts' expert placements
(``--n-cpu-moe N`` and per-layer ``-ot``) that fit the memory, ranked by predicted speed
(``llamacpp_instr.deciding.moe_plan``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload

F = TypeVar("F", bound=Callable[..., object])

experts_option: Callable[[F], F] = click.option(
    "--experts",
    is_flag=True,
    help="Rank where a mixture of experts' expert weights go instead: the other layers where -ngl "
    "puts them (default all), the experts of the first N layers on the CPU for each N "
    "(--n-cpu-moe N) and, per count, the layers cheapest to keep there (an -ot rule), each "
    "checked against the memory with llama.cpp's projection of the model loaded with its rules "
    "and priced from the logs' measured ops, copies and expert traffic (their routing); each "
    "with its command line and -ot rule.",
)


def rank_experts(
    model: Path,
    logs: list[Path],
    limits: dict[str, int],
    n_ctx: int | None,
    offload: Offload,
    fmt: str,
) -> None:
    """Print the ranked expert placements; exit 3 when none fits."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.deciding import moe_plan
    from llamacpp_instr.running.memory_budget import OutOfMemory

    if not logs:
        raise UserError("--experts ranks by speed: give a detailed log of a run of this model")
    out, overflow = moe_plan.command(model, logs, limits, n_ctx, offload, fmt)
    click.echo(out)
    if overflow is not None:
        raise OutOfMemory(f"no expert placement fits: every one overflows {', '.join(overflow)}")
