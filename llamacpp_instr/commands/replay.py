"""``instr replay``: a server's recorded requests sent again at their recorded times, to llama-server
under each setting or to a running server, and what changed, request by request and in
percentiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from llamacpp_instr.cli_shared.options import output_option, session_option


def _slo(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    from llamacpp_instr.converters.session.replay_figures import parse_slo

    return None if value is None else parse_slo(value)


def _window(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    from llamacpp_instr.converters.session.replay_log import parse_window

    return None if value is None else parse_window(value)


def _format_option(f: Any) -> Any:
    from llamacpp_instr.converters.reports.renderers import RENDERERS

    return click.option(
        "--format",
        "fmt",
        type=click.Choice(list(RENDERERS)),
        default="text",
        show_default=True,
        help="The comparison's format, on stdout: " + ", ".join(RENDERERS) + ".",
    )(f)


@click.command("replay", context_settings={"ignore_unknown_options": True})
@click.argument("log", type=click.Path(path_type=Path))
@output_option(
    "The replay's session log (NEW.log; with --set, NEW.<k>.log per setting), each with its "
    "responses beside it (NEW.log.responses.jsonl). Default: replay_YYYYMMDD_HHMMSS.log."
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    help='llama-server arguments added to those after -- for one replay ("-b 512"); repeated, '
    "one replay each, compared in one table.",
)
@click.option("--url", default=None, help="Replay against this running server instead.")
@click.option(
    "--api-key",
    metavar="KEY",
    default=None,
    help="The API key of the server at --url, sent as Authorization: Bearer KEY (a server the "
    "replay starts takes its own: its --api-key, --api-key-file or LLAMA_API_KEY).",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Send X times faster: the recorded gaps between arrivals divided by X.",
)
@click.option(
    "--first", type=click.IntRange(min=1), default=None, help="Only the first N requests."
)
@click.option(
    "--window",
    callback=_window,
    default=None,
    help="Only the requests that arrived from START to END seconds after the first (START:END).",
)
@click.option(
    "--media",
    type=click.Path(path_type=Path),
    default=None,
    help="A folder holding the images and sounds the requests sent, found by their hash.",
)
@click.option(
    "--slo",
    callback=_slo,
    default=None,
    help="The service-level objective of goodput and the verdict: ttft=MS,tpot=MS.",
)
@_format_option
@session_option
@click.argument("server", nargs=-1, type=click.UNPROCESSED)
def command(
    log: Path,
    output: Path | None,
    settings: tuple[str, ...],
    url: str | None,
    api_key: str | None,
    speed: float,
    first: int | None,
    window: tuple[float, float] | None,
    media: Path | None,
    slo: Any,
    fmt: str,
    sid: str | None,
    server: tuple[str, ...],
) -> None:
    """Replay LOG's requests (llama-server's, recorded by `instr exec` at detailed, bodies and
    all) at their recorded times (open loop: the recorded concurrency follows from them), against
    llama-server started as `instr exec` starts it (SERVER: `-- llama-server ARGS...`, a free
    --port where ARGS name none), once per --set, or against --url. Each request is timed as its
    client sees it (time to first token and every gap of a stream, end to end), and set against
    the recording and the new log's own record of it: percentiles (p50, p90, p99) of TTFT, TPOT,
    ITL and end to end, throughput, goodput under --slo, peak memory per device, prompt-cache
    reuse, whether it generated the same tokens, the late tokens as `instr requests` names their
    causes (another request's prefill in the same batch), and the best setting for the SLO. A
    request the server refuses counts as failed and the replay goes on; a server that ends
    mid-replay ends it with one line (exit status 1), its log kept. A server with an API key: the
    requests carry its key (Authorization: Bearer), which reaches a server the replay starts in its
    environment, never on its command line (which its log records), and is written nowhere:

    \b
        instr replay server.log -o new.log -- llama-server -m model.gguf -np 4
        instr replay server.log --slo ttft=500,tpot=50 --set "-b 512" \\
            --set "-b 2048 -ub 2048" -o new.log -- llama-server -m model.gguf
    """
    from llamacpp_instr.cli_shared.output import emit
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.reports.renderers import render
    from llamacpp_instr.converters.reports.renderers.progress import replay_bar
    from llamacpp_instr.converters.reports.replay_report import replay_report
    from llamacpp_instr.converters.session.replay_log import Selection
    from llamacpp_instr.deciding.replay_verdict import best_setting
    from llamacpp_instr.running.replay.rerun import ReplayRequest, replay

    if server and server[0] != "llama-server":
        raise UserError(f"instr replay starts llama-server, not {server[0]}: -- llama-server ARGS")
    request = ReplayRequest(
        log=log,
        output=output,
        server_args=server[1:] if server else (),
        settings=settings,
        url=url,
        api_key=api_key,
        speed=speed,
        selection=Selection(first=first, window=window, sid=sid),
        media=media,
        slo=slo,
    )
    result = replay(request, say=lambda line: click.echo(line, err=True), progress=replay_bar)
    verdict = best_setting(result.summaries, slo)
    line, best = (verdict.line(), verdict.setting) if verdict else (None, None)
    emit(render(replay_report(result, line, best), fmt), None)
