"""The options that place weight tensors by name, as llama.cpp's programs take them:
-ot/--override-tensor, -ncmoe/--n-cpu-moe and -cmoe/--cpu-moe (llamacpp_instr.running.tensor_overrides).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from llamacpp_instr.contract.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


class _OverrideValue(click.ParamType):
    """One -ot value, parsed to (pattern, buffer type) pairs; a bad one is click's usage error."""

    name = "PATTERN=BUFFER_TYPE[,...]"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return self.name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from llamacpp_instr.running.tensor_overrides import parse_override

        if not isinstance(value, str):
            return value
        try:
            parse_override(value)
        except UserError as exc:
            self.fail(str(exc).removeprefix("-ot/--override-tensor").lstrip(": "), param, ctx)
        return value


def tensor_options(f: F) -> F:
    """-ot (repeatable), -ncmoe and -cmoe, passed to the command as one ``tensors`` (a
    ``tensor_overrides.TensorOverrides``)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from llamacpp_instr.running.tensor_overrides import TensorOverrides

        kwargs["tensors"] = TensorOverrides.from_options(
            kwargs.pop("override_tensor", ()) or (),
            kwargs.pop("n_cpu_moe", None),
            kwargs.pop("cpu_moe", False),
        )
        return f(*args, **kwargs)

    g: Any = wrapper
    g = click.option(
        "-cmoe",
        "--cpu-moe",
        is_flag=True,
        help="Keep every layer's MoE expert weights on the CPU (llama.cpp's -cmoe).",
    )(g)
    g = click.option(
        "-ncmoe",
        "--n-cpu-moe",
        type=click.IntRange(min=0),
        default=None,
        metavar="N",
        help="Keep the MoE expert weights of the first N layers on the CPU (llama.cpp's "
        "-ncmoe: the other layers' go where -ngl puts their layer).",
    )(g)
    g = click.option(
        "-ot",
        "--override-tensor",
        type=_OverrideValue(),
        multiple=True,
        help="Put the weight tensors whose name the regular expression PATTERN matches in "
        "BUFFER_TYPE (CPU, Vulkan0...), as llama.cpp's -ot; repeatable, the first match wins "
        "(-ot rules before -cmoe's and -ncmoe's).",
    )(g)
    return g  # type: ignore[no-any-return]
