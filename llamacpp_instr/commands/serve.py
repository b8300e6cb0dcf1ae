"""``instr serve``: an OpenAI-compatible server whose every request is profiled."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llamacpp_instr.cli_shared.always_on_options import always_on_options
from llamacpp_instr.cli_shared.deprecated import out_alias
from llamacpp_instr.cli_shared.offload_options import offload_options
from llamacpp_instr.cli_shared.options import (
    append_option,
    ctx_option,
    level_option,
    log_option,
    memory_budget_option,
    metrics_option,
    threads_option,
    topk_option,
    value_stats_option,
    warmup_option,
)
from llamacpp_instr.cli_shared.tensor_options import tensor_options


@click.command("serve")
@click.argument("model", required=False, type=click.Path(path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="TCP port."
)
@level_option
@always_on_options()
@log_option
@append_option
@out_alias
@ctx_option
@threads_option
@warmup_option
@offload_options()
@tensor_options
@memory_budget_option
@topk_option
@value_stats_option
@metrics_option
# every option but these three is a parameter of running.serve.serve, by the same name
def command(model: Path | None, output: Path | None, metrics: str | None, **settings: Any) -> None:
    """Serve MODEL.gguf (default: the bundled SmolLM2-135M-Instruct) with llama-cpp-python's
    OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/embeddings, /v1/models),
    writing one session log for the server's life.

    Each HTTP request is recorded (request id, endpoint, status, time waiting for the model, time to
    first token, total time, tokens decoded) and its decode steps carry its id: `instr to-perfetto`
    draws them on a `requests` track, `instr summary` gives latency percentiles. Requests that
    fail are recorded with their HTTP status, streams the client dropped as `cancelled`. Ctrl-C
    or SIGTERM stops the server and ends the session as `interrupted`; the log stays valid.
    SIGHUP reopens the log at its path (logrotate); --max-bytes rotates it itself. SIGUSR1
    switches the level between minimal and --level (detailed when that is minimal) from the next
    step. --metrics HOST:PORT serves the log's figures to Prometheus from a process of its own
    (`instr follow --prometheus`). Contexts open as llama-server opens them: flash attention
    auto, 2048 tokens a batch, 512 a graph compute."""
    from llamacpp_instr.native import models
    from llamacpp_instr.running import runner, serve

    path = model if model is not None else models.default_model()
    log = output or runner.default_log_name()

    if metrics is not None:
        from llamacpp_instr.running import exporter_launch as launch

        # before the model loads: a port in use stops here; it ends after this process does
        launch.start_beside(log, metrics)

    result = serve.serve(path, log, on_ready=lambda msg: click.echo(msg, err=True), **settings)
    click.echo(
        f"session log: {result.log_path} ({result.requests} requests, {result.steps} steps; "
        f"status {result.status})",
        err=True,
    )
