"""``instr doctor``: which llama_cpp is installed, and is it our patched build of these patches?"""

from __future__ import annotations

import click


@click.command("doctor")
def command() -> None:
    """Report the installed llama-cpp-python: stock or patched, and whether its patch hash matches
    the patches shipped with this llamacpp-instr (exit status 2 when the hooks are missing or out
    of date)."""
    import sys

    from llamacpp_instr import bindings, build, pin
    from llamacpp_instr.converters.errors import UserError
    from llamacpp_instr.paths import PATCHES_DIR

    version = build.installed_llama_cpp_version()
    click.echo(
        f"llamacpp-instr pin: llama-cpp-python {pin.LLAMA_CPP_PYTHON_VERSION}, llama.cpp {pin.LLAMA_CPP_COMMIT}"
    )
    want = build.source_patch_hash()
    click.echo(
        f"patches ({PATCHES_DIR}): {len(build.read_series())} patches, "
        f"{len(build.read_overlay())} overlay files, patch hash {want}"
    )
    if version is None:
        raise UserError("llama-cpp-python is not installed; run `instr build`")
    click.echo(f"installed llama-cpp-python: {version}")
    api = bindings.load()  # raises for the stock build
    info = api.build_info()
    click.echo(
        f"instrumentation: API {info['api_version']}, llama.cpp {info['llama_cpp_commit']}, "
        f"patch hash {info['patch_hash']}"
    )
    if info["patch_hash"] != want:
        click.echo(
            f"error: the installed build has patch hash {info['patch_hash']} but the patches are "
            f"{want}; "
            "run `instr build`",
            err=True,
        )
        sys.exit(2)
    click.echo("ok: the patched build matches the patches")
