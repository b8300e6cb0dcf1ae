"""``instr peaks``: measure this machine's memory bandwidth and matmul peaks, once per machine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.options import report_options, threads_option
from llamacpp_instr.cli_shared.output import check_output, emit
from llamacpp_instr.running.peak_probe import DEFAULT_TYPES

if TYPE_CHECKING:
    from llamacpp_instr.running.offload import Offload


@click.command("peaks")
@threads_option
@click.option(
    "--types",
    default=",".join(DEFAULT_TYPES),
    show_default=True,
    help="Weight types whose matmul peak to measure (ggml type names, comma-separated; not a type "
    "ggml quantizes only with an importance matrix, iq2_xxs, iq2_xs, iq1_s, nor one it cannot "
    "make from F32 values, i8 ... f64, q8_1, q8_k).",
)
@click.option(
    "--force", is_flag=True, help="Measure again even if this machine's peaks are cached."
)
@click.option(
    "--size-mib",
    type=click.IntRange(min=1, max=4096),
    default=256,
    show_default=True,
    help="Size of each of the bandwidth probe's three buffers (far beyond the last-level cache).",
)
@click.option(
    "--thread-counts",
    metavar="N,M,...",
    default=None,
    help="Measure the CPU at each of these thread counts, taking turns over five rounds (each "
    "figure the median of its rounds): what `instr predict --threads` prices a count no log ran "
    "by is the ratio of two counts' figures, and counts measured apart on a shared machine can "
    "see it at different speeds. Saved per count, as --threads does.",
)
@offload_options(layers=False, split=False)
@report_options()
def command(
    threads: int | None,
    types: str,
    force: bool,
    size_mib: int,
    thread_counts: str | None,
    offload: Offload,
    fmt: str,
    output: Path | None,
) -> None:
    """Measure this machine's peaks with ggml itself: for each device of the installed build (the
    CPU with the runs' thread count, and each GPU), the memory bandwidth of a large ADD and the
    matmul GFLOP/s per weight type, through the same kernels a run uses; on the CPU also a
    matmul by one column (a generated token's) of each type, its weight far beyond the caches,
    which `instr predict --threads` moves a generation step's matmuls by. Cached per machine (CPU
    model, threads, GPU names) under the cache directory and reused; `instr summary` and
    `instr compare` set every op of a log from this machine against them.

    --rpc adds RPC servers to the devices as a run with the same --rpc does, so the peaks fit its
    logs (an RPC device itself is not probed: ggml-rpc's compute returns before the server has
    run it). --device measures the CPU and only the devices named, adding them to the machine's
    cached peaks."""
    from llamacpp_instr.converters.reports.renderers import render
    from llamacpp_instr.converters.reports.roofline_report import peaks_report
    from llamacpp_instr.native.paths import cache_dir
    from llamacpp_instr.running.peaks_request import PeaksRequest, measure_peaks

    check_output(output)
    counts = _counts(thread_counts) if thread_counts is not None else [threads] if threads else []
    type_list = tuple(t.strip().lower() for t in types.split(",") if t.strip())
    request = PeaksRequest(type_list, tuple(counts), size_mib, force, offload)
    got = measure_peaks(request, cache_dir(), say=lambda line: click.echo(line, err=True))
    emit("\n".join(render(peaks_report(one), fmt) for one in got), output)


def _counts(text: str) -> list[int]:
    """``--thread-counts``' counts, each once, in order (a UsageError for anything else)."""
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise click.BadParameter(
            f"takes distinct thread counts of at least 1, comma-separated (1,2), not {text!r}",
            param_hint="--thread-counts",
        )
    return counts
