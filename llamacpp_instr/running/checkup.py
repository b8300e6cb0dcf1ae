"""What is installed (``instr doctor``, ``instr doctor --tools``): the llama-cpp-python build and whether it
is made of these patches, the devices its ggml sees, and where llama.cpp's own programs are."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.converters.reports.report import Column, Fact, Report, Section, Table
from llamacpp_instr.native import build_plan, patching, pin, tools, wheel
from llamacpp_instr.native.paths import PATCHES_DIR


@dataclass
class Checkup:
    """The installed build against the patches, and its devices (as a session records them in
    ``session_start.machine.devices``); ``problem``: what is wrong, if anything (exit 2)."""

    patches: str
    patch_hash: str
    installed: str | None = None
    instrumentation: str | None = None
    backends: list[str] = field(default_factory=list)  # the backend libraries beside libllama
    devices: list[dict[str, Any]] = field(default_factory=list)
    problem: UserError | None = None

    def failure(self) -> UserError | None:
        return self.problem


def check(rpc: tuple[str, ...] = ()) -> Checkup:
    """The checkup, the RPC servers ``rpc`` added to the devices first, as a run adds them."""
    from llamacpp_instr.native import backends, bindings
    from llamacpp_instr.running import devices

    want = patching.source_patch_hash()
    c = Checkup(
        patches=f"{len(patching.read_series())} patches, {len(patching.read_overlay())} overlay files, "
        f"patch hash {want}",
        patch_hash=want,
        installed=wheel.installed_llama_cpp_version(),
    )
    if c.installed is None:
        c.problem = UserError("llama-cpp-python is not installed; run `instr build`")
        return c
    try:
        api = bindings.load()  # raises for the stock build
        info = api.build_info()
        c.instrumentation = (
            f"API {info['api_version']}, llama.cpp {info['llama_cpp_commit']}, "
            f"patch hash {info['patch_hash']}"
        )
        c.backends = backends.loaded()
        devices.add_rpc_servers(rpc)
    except UserError as exc:
        c.problem = exc
        return c
    c.devices = api.machine_info().get("devices", [])
    if info["patch_hash"] != want:
        c.problem = UserError(
            f"the installed build has patch hash {info['patch_hash']} but the patches are "
            f"{want}; run `instr build`"
        )
    return c


def report(c: Checkup) -> Report:
    facts = [
        Fact(
            "llamacpp-instr pin",
            f"llama-cpp-python {pin.LLAMA_CPP_PYTHON_VERSION}, llama.cpp {pin.LLAMA_CPP_COMMIT}",
        ),
        Fact(f"patches ({PATCHES_DIR})", c.patches),
    ]
    if c.installed is not None:
        facts.append(Fact("installed llama-cpp-python", c.installed))
    if c.instrumentation is not None:
        facts.append(Fact("instrumentation", c.instrumentation))
        facts.append(Fact("backends in this build", ", ".join(c.backends) or "?"))
    if c.problem is None:
        facts.append(Fact("status", "ok: the patched build matches the patches"))
    rows = [
        {
            "name": str(d.get("name", "?")),
            "backend": str(d.get("backend", "?")),
            "type": str(d.get("type", "?")),
            "memory_total": _memory(d.get("memory_total")),
            "memory_free": _memory(d.get("memory_free")),
            "description": str(d.get("description", "")),
        }
        for d in c.devices
    ]
    table = Table(
        name="devices",
        title=f"devices ({len(rows)}, in ggml's order):",
        columns=[
            Column("name", "name"),
            Column("backend", "backend"),
            Column("type", "type"),
            Column("memory_total", "memory total", "bytes"),
            Column("memory_free", "free", "bytes"),
            Column("description", "description"),
        ],
        rows=rows,
        whole=True,
    )
    sections = [Section(title="Devices", tables=[table])] if c.instrumentation else []
    return Report(title="The installed build (instr doctor)", facts=facts, sections=sections)


def _memory(n: Any) -> int | None:
    """A device's memory in bytes; None where ggml does not know it."""
    return n if isinstance(n, int) and n > 0 else None


@dataclass
class Programs:
    """Where llama.cpp's own programs of the current patches are (``instr build --tools``)."""

    where: dict[str, str]  # program: its path, or how to build it


def programs(vulkan: bool = False) -> Programs:
    """The programs built for the CPU, or with ggml's Vulkan backend."""
    folder = tools.bin_dir(tools.tools_plan(build_plan.VULKAN_CMAKE_ARGS if vulkan else ()))
    command = tools.BUILD_COMMAND + (" --vulkan" if vulkan else "")
    where = {}
    for program in tools.PROGRAMS:
        exe = folder / program
        where[program] = str(exe) if exe.is_file() else f"not built (run `{command}`)"
    return Programs(where)


def programs_report(p: Programs) -> Report:
    table = Table(
        name="programs",
        title="llama.cpp's programs of the current patches",
        columns=[Column("program", "program"), Column("where", "where")],
        rows=[{"program": k, "where": v} for k, v in p.where.items()],
        whole=True,
    )
    return Report(
        title="llama.cpp's own programs (instr doctor --tools)",
        sections=[Section(title="Programs", tables=[table])],
        data={"programs": p.where},
    )
