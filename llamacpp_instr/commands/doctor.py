"""``instr doctor``: which llama_cpp is installed, is it our patched build of these patches, and
which devices can its ggml run on?"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from llamacpp_instr.commands.offload_options import offload_options
from llamacpp_instr.contract.units import fmt_bytes

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("doctor")
@offload_options(layers=False, device=False, split=False)
def command(offload: Offload) -> None:
    """Report the installed llama-cpp-python: stock or patched, and whether its patch hash matches
    the patches shipped with this llamacpp-instr (exit status 2 when the hooks are missing or out
    of date); the backends the build has (CUDA, Vulkan, ...: their libraries, whether or not a
    device of theirs is here); then ggml's devices, the names --device takes: name, backend, type (cpu, gpu, igpu,
    accel, other) and memory, as a session records them in session_start.machine.devices. --rpc
    adds RPC servers first, as a run would."""
    import sys

    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.native import backends, bindings, build, pin
    from llamacpp_instr.native.paths import PATCHES_DIR
    from llamacpp_instr.running import devices

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
    click.echo(f"backends in this build: {', '.join(backends.loaded()) or '?'}")
    devices.add_rpc_servers(offload.rpc)
    for line in device_lines(api.machine_info().get("devices", [])):
        click.echo(line)
    if info["patch_hash"] != want:
        click.echo(
            f"error: the installed build has patch hash {info['patch_hash']} but the patches are "
            f"{want}; "
            "run `instr build`",
            err=True,
        )
        sys.exit(2)
    click.echo("ok: the patched build matches the patches")


def device_lines(devs: list[dict[str, Any]]) -> list[str]:
    """ggml's devices as a table: a heading line, then one line per device."""
    rows = [("name", "backend", "type", "memory total", "free", "description")]
    rows += [
        (
            str(d.get("name", "?")),
            str(d.get("backend", "?")),
            str(d.get("type", "?")),
            _memory(d.get("memory_total")),
            _memory(d.get("memory_free")),
            str(d.get("description", "")),
        )
        for d in devs
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    out = [f"devices ({len(devs)}, in ggml's order):"]
    for r in rows:
        cells = [r[i].rjust(widths[i]) if i in (3, 4) else r[i].ljust(widths[i]) for i in range(5)]
        out.append("  " + "  ".join(cells) + "  " + r[5])
    return out


def _memory(n: Any) -> str:
    return fmt_bytes(n) if isinstance(n, int) and n > 0 else "?"
