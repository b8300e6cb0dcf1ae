"""``instr doctor``: which llama_cpp is installed, and is it our patched build of these patches?"""

from __future__ import annotations

import click


@click.command("doctor")
def command() -> None:
    """Report the installed llama-cpp-python: stock or patched, and whether its patch hash matches
    this checkout's patches/ (exit status 2 when the hooks are missing or out of date)."""
    import sys

    from converters.errors import UserError
    from llamacpp_instr import bindings, build, pin

    version = build.installed_llama_cpp_version()
    click.echo(
        f"llamacpp-instr pin: llama-cpp-python {pin.LLAMA_CPP_PYTHON_VERSION}, llama.cpp {pin.LLAMA_CPP_COMMIT}"
    )
    want = build.source_patch_hash()
    click.echo(f"patches/: {len(build.read_series())} patches, patch hash {want}")
    if version is None:
        raise UserError("llama-cpp-python is not installed; run `instr build`")
    click.echo(f"installed llama-cpp-python: {version}")
    api = bindings.load()  # raises for the stock build
    info = api.build_info()
    click.echo(
        f"instrumentation: API {info['api_version']}, llama.cpp {info['llama_cpp_commit']}, "
        f"patch hash {info['patch_hash']}"
    )
    if want is None:
        click.echo("ok: patched build (no patches/ here to compare with)")
        return
    if info["patch_hash"] != want:
        click.echo(
            f"error: the installed build has patch hash {info['patch_hash']} but patches/ is {want}; "
            "run `instr build`",
            err=True,
        )
        sys.exit(2)
    click.echo("ok: the patched build matches patches/")
