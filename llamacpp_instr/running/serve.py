"""``instr serve``: llama-cpp-python's own OpenAI-compatible server, with one session for its life.

Each HTTP request becomes a ``request`` record (docs/schema.md): its id, endpoint, HTTP status,
what became of it (``outcome``: ok, error, or cancelled when the client went away, with the tokens
a stream was sent), when it arrived, when it got the model (the server runs one request at a time
behind a lock), when its first token was sampled, when it ended, and the tokens it decoded. Its
decode steps carry the same id (``step_begin.request``). All times are CLOCK_MONOTONIC ns, the
log's own clock. SIGHUP reopens the log at its path (logrotate); SIGUSR1 switches the level between
minimal and the one the server started at (detailed when that was minimal), as a llama.cpp program
under ``instr exec`` does.

How: a pure-ASGI middleware times the request and puts it in a context variable (which reaches the
worker threads the server runs the model in); wrappers on the server's ``Llama`` instance, around
the methods every endpoint goes through (``create_completion``, ``embed``, ``eval``), mark when
the model started, tag the steps and note the first token.
"""

from __future__ import annotations

import contextvars
import errno
import itertools
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import LEVEL_IDS
from llamacpp_instr.contract.version import __version__
from llamacpp_instr.converters.reading.reader import iter_records
from llamacpp_instr.native import bindings
from llamacpp_instr.running import context_choices, context_defaults, tensor_buffers
from llamacpp_instr.running import memory_budget as memory
from llamacpp_instr.running.always_on import AlwaysOn
from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.placement import prepare
from llamacpp_instr.running.tensor_overrides import TensorOverrides

# At shutdown, how long to wait for a worker thread still using the model (a generation the server
# cannot cancel) before exiting without freeing it.
CLOSE_TIMEOUT_S = 10.0

_SERVER_EXTRA_HINT = "pip install 'llamacpp-instr[serve]' (llama-cpp-python's server extra)"


@dataclass
class _Request:
    id: str
    endpoint: str
    method: str
    t_arrive: int
    t_model: int | None = None
    t_first_token: int | None = None
    t_model_done: int | None = None
    t_end: int | None = None
    status: int = 0
    stream: bool = False
    prompt_tokens: int = 0
    gen_tokens: int = 0
    evals: int = 0
    complete: bool = False  # the whole response was sent
    error: str | None = None
    tokens_sent: int = 0  # stream chunks with a token handed to the server
    level: str | None = None  # the level its steps were recorded at (request sampling)
    _totals0: tuple[int, int] | None = None

    @property
    def outcome(self) -> str:
        """ok; error (an HTTP error status, or the handler failed); cancelled (the client went
        away before the response was complete)."""
        if self.status >= 400 or (self.error is not None and self.status == 0):
            return "error"
        return "ok" if self.complete else "cancelled"

    def fields(self) -> dict[str, Any]:
        def since(t: int | None) -> int | None:
            return None if t is None else t - self.t_arrive

        outcome = self.outcome
        status = self.status or (500 if outcome == "error" else 499)  # no response was sent
        return {
            "id": self.id,
            "endpoint": self.endpoint,
            "method": self.method,
            "status": status,
            "outcome": outcome,
            **({"error": self.error[:200]} if self.error and outcome == "error" else {}),
            "stream": self.stream,
            **({"tokens_sent": self.tokens_sent} if self.stream else {}),
            **({"level": self.level} if self.level else {}),
            "t_arrive": self.t_arrive,
            "wait": since(self.t_model),
            "ttft": since(self.t_first_token),
            # how long it held the model (from getting it to its last token)
            "model": (
                None
                if self.t_model is None or self.t_model_done is None
                else self.t_model_done - self.t_model
            ),
            "dur": since(self.t_end),
            "prompt_tokens": self.prompt_tokens,  # decoded for the prompt (after the prefix cache)
            "gen_tokens": self.gen_tokens,  # generated tokens decoded (fed back)
        }


CURRENT: contextvars.ContextVar[_Request | None] = contextvars.ContextVar(
    "llamacpp_instr_request", default=None
)


def check_port(host: str, port: int) -> None:
    """Refuse a port that is taken, before the model loads."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"cannot resolve host {host!r}: {exc.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserError(
                    f"port {port} on {host} is in use (choose another --port)"
                ) from None
            raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


class RequestRecorder:
    """ASGI middleware: one ``request`` record per HTTP request."""

    def __init__(self, app: Any, api: bindings.InstrLib) -> None:
        self.app = app
        self.api = api
        self._ids = itertools.count(1)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rec = _Request(
            id=f"req-{next(self._ids)}",
            endpoint=scope.get("path", ""),
            method=scope.get("method", ""),
            t_arrive=time.monotonic_ns(),
        )
        token = CURRENT.set(rec)

        async def send_and_note(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                rec.status = int(message["status"])
                headers = dict(message.get("headers") or [])
                rec.stream = b"text/event-stream" in headers.get(b"content-type", b"")
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                rec.complete = True

        try:
            await self.app(scope, receive, send_and_note)
        except Exception as exc:
            # (the server's outer middleware answers 500 if nothing was sent yet)
            rec.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            CURRENT.reset(token)
            rec.t_end = time.monotonic_ns()
            try:
                self.api.write_record("request", rec.fields())
                self.api.flush()  # the server may now idle: a follower sees the request at once
            except UserError:
                pass  # the session has ended (shutting down): nothing to write to


def _totals(api: bindings.InstrLib) -> tuple[int, int]:
    t = api.totals()
    return t.n_prompt_tokens, t.n_gen_tokens


class ModelUse:
    """How many calls are using the model now (the server runs them on worker threads), so that
    shutdown frees the model only once none is."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._n = 0

    def enter(self) -> None:
        with self._cond:
            self._n += 1

    def leave(self) -> None:
        with self._cond:
            self._n -= 1
            if self._n == 0:
                self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """True once no call uses the model; False if one still does after ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self._n == 0, timeout)


def close_when_idle(llm: Any, use: ModelUse, timeout: float = CLOSE_TIMEOUT_S) -> bool:
    """Free the model once no worker uses it; after ``timeout``, leave it to the process's exit
    (freeing it under a running generation would crash that thread). True if it was freed."""
    if not use.wait_idle(timeout):
        print(
            f"instr serve: a request was still using the model after {timeout:g}s; "
            "exiting without freeing it",
            file=sys.stderr,
        )
        return False
    llm.close()
    return True


def instrument(llm: Any, api: bindings.InstrLib) -> ModelUse:
    """Wrap the server's Llama instance (instance attributes: the class is untouched); the
    returned ModelUse counts the calls using the model."""
    marks = _Marks(llm, api)
    llm.create_completion = marks.around(llm.create_completion)
    llm.embed = marks.around(llm.embed)
    llm.eval = marks.eval_and_note
    return marks.use


class _Marks:
    """The request marks around a server's Llama (``instrument``): a request begins with the
    first call that uses the model and ends when that call (or its stream) is done."""

    def __init__(self, llm: Any, api: bindings.InstrLib) -> None:
        self.ctx = llm.ctx
        self.api = api
        self.use = ModelUse()
        self.eval_fn = llm.eval

    def started(self, rec: _Request) -> None:
        self.api.set_request(self.ctx, rec.id)
        if rec.t_model is None:
            rec.t_model = time.monotonic_ns()
            rec._totals0 = _totals(self.api)
            rec.level = self.api.request_begin(self.ctx)  # sampled in (--sample-requests) or not

    def finished(self, rec: _Request) -> None:
        if rec.evals == 0 and rec._totals0 is not None:
            # no eval (embeddings decode directly): the session's counts moved by this request
            p, g = _totals(self.api)
            rec.prompt_tokens = p - rec._totals0[0] + g - rec._totals0[1]
        rec.t_model_done = time.monotonic_ns()
        if rec.t_first_token is None and rec.evals > 0:
            rec.t_first_token = rec.t_model_done  # one token: sampled after the last eval
        try:
            self.api.set_request(self.ctx, None)
            self.api.request_end(self.ctx)
        except UserError:
            pass  # a stream closed after the session ended (shutdown)

    def around(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            rec = CURRENT.get()
            self.use.enter()
            try:
                if rec is not None:
                    self.started(rec)
                result = fn(*args, **kwargs)
            except BaseException:
                if rec is not None:
                    self.finished(rec)
                self.use.leave()
                raise
            if isinstance(result, Iterator):
                # a stream uses the model until it is exhausted or closed
                return self.streamed(result, rec)
            if rec is not None:
                self.finished(rec)
            self.use.leave()
            return result

        return wrapper

    def streamed(self, it: Iterator[Any], rec: _Request | None) -> Iterator[Any]:
        try:
            for chunk in it:
                if rec is not None and _has_token(chunk):
                    rec.tokens_sent += 1
                yield chunk
        finally:
            if rec is not None:
                self.finished(rec)
            self.use.leave()

    def eval_and_note(self, tokens: Any) -> Any:
        rec = CURRENT.get()
        if rec is not None:
            # the first eval decodes the prompt (what the prefix cache did not hold); each later
            # one feeds back a sampled token, the second one the first
            if rec.evals == 0:
                rec.prompt_tokens += len(tokens)
            else:
                rec.gen_tokens += len(tokens)
                if rec.t_first_token is None:
                    rec.t_first_token = time.monotonic_ns()
            rec.evals += 1
        self.use.enter()
        try:
            return self.eval_fn(tokens)
        finally:
            self.use.leave()


def _has_token(chunk: Any) -> bool:
    """A streamed completion chunk carrying a token (not the closing one with its finish
    reason)."""
    try:
        return chunk["choices"][0].get("finish_reason") is None
    except (KeyError, IndexError, TypeError, AttributeError):
        return False


@dataclass
class ServeResult:
    log_path: Path
    status: str
    requests: int
    steps: int


def _load_app(
    model: Path,
    host: str,
    port: int,
    n_ctx: int,
    n_threads: int,
    api: Any,
    loading: tuple[Any, TensorOverrides],
) -> tuple[Any, Any]:
    """llama-cpp-python's server app with its ``Llama`` loaded inside the placement's and the
    tensor rules' loading contexts, and that ``Llama``; a load that fails is one line (out of
    memory, or why the model would not load)."""
    from llamacpp_instr.native import models

    try:
        from llama_cpp.server import app as server_app
        from llama_cpp.server.settings import Settings
    except ImportError as exc:
        raise UserError(f"instr serve needs {exc.name}: {_SERVER_EXTRA_HINT}") from None
    placement, tensors = loading
    failed_before = api.memory_failure()
    settings = Settings(
        model=str(model),
        host=host,
        port=port,
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        # llama.cpp's own batch sizes, as llama-server takes them (llama-cpp-python's: 512 both)
        n_batch=context_choices.LLAMA_N_BATCH,
        n_ubatch=context_choices.LLAMA_N_UBATCH,
        verbose=False,
        # queue concurrent requests instead of cutting a running stream short (the server's
        # default): a profile shows every request complete
        interrupt_requests=False,
    )
    try:
        # the server's Llama loads inside, at llama.cpp's default flash attention (auto)
        with (
            placement.loading(),
            tensor_buffers.loading(tensors),
            context_defaults.opening(None),
        ):
            app = server_app.create_app(settings=settings)
    except (ValueError, RuntimeError) as exc:
        setting = memory.Setting(n_ctx=n_ctx, n_ubatch=settings.n_ubatch, ctx_flag="--ctx")
        oom = memory.explain(api, failed_before, setting)
        raise oom or UserError(models.explain_load_failure(model)) from exc
    proxy = server_app._llama_proxy
    llm = getattr(proxy, "_current_model", None)
    if llm is None:
        raise UserError(
            "the server did not load the model (llama-cpp-python's LlamaProxy changed?)"
        )
    return app, llm


def _metadata(
    model: Path,
    server: dict[str, Any],
    always_on: AlwaysOn,
    offload: Offload,
    tensors: TensorOverrides,
) -> dict[str, Any]:
    """The session's metadata: the tool, the command, the model and how it is served."""
    return {
        "tool": f"llamacpp-instr {__version__}",
        "command": "instr serve",
        "model_path": str(model),
        "server": server,
        "flash_attn_type": context_choices.flash_attn_name(None),
        "always_on": always_on.metadata(),
        "offload": offload.describe(),
        **({"tensor_overrides": tensors.describe()} if tensors else {}),
    }


class _Stopped(KeyboardInterrupt):
    """SIGTERM, or a shutdown uvicorn handled itself: the session ends as interrupted, as on
    Ctrl-C (api.session's status for KeyboardInterrupt)."""


def _on_term(signum: int, frame: Any) -> None:
    raise _Stopped()


def _run_server(server: Any, api: bindings.InstrLib, level: str, ready: Callable[[], None]) -> None:
    """Run uvicorn's ``server`` inside the session, with SIGTERM ending it as interrupted,
    SIGHUP reopening the log and SIGUSR1 switching its level (the handlers before restored);
    ``ready`` is called once the handlers are in place."""
    previous = signal.signal(signal.SIGTERM, _on_term)
    # logrotate moved the log: reopen it at its path (between steps; a flag only)
    previous_hup = signal.signal(signal.SIGHUP, lambda signum, frame: api.reopen())
    previous_usr1 = signal.signal(signal.SIGUSR1, lambda signum, frame: switch_level(api, level))
    try:
        ready()
        server.run()
        if server.should_exit:
            raise _Stopped()
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGHUP, previous_hup)
        signal.signal(signal.SIGUSR1, previous_usr1)


def switch_level(api: bindings.InstrLib, opened: str) -> None:
    """SIGUSR1: record from the next step at minimal, or back at the level the session ``opened``
    at (detailed when that was minimal), as the library does for a llama.cpp program; one line on
    stderr says which."""
    up = opened if LEVEL_IDS[opened] > LEVEL_IDS["minimal"] else "detailed"
    now = api.get_level()
    if now == LEVEL_IDS["off"]:
        return  # the session has ended
    to = "minimal" if now > LEVEL_IDS["minimal"] else up
    api.set_level(to)
    print(
        f"instr serve: SIGUSR1: recording at {to} from the next step", file=sys.stderr, flush=True
    )


def serve(
    model: Path,
    out: Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    level: str = "detailed",
    n_ctx: int = 2048,
    threads: int | None = None,
    warmup: bool = True,
    top_k_logits: int = 10,
    value_stats: bool = False,
    on_ready: Callable[[str], None] | None = None,
    always_on: AlwaysOn | None = None,
    offload: Offload | None = None,
    memory_budget: str | None = None,
    tensors: TensorOverrides | None = None,
    append: bool = False,
) -> ServeResult:
    """Serve ``model`` until SIGINT or SIGTERM; the session log stays valid either way. SIGHUP
    reopens the log at its path, SIGUSR1 switches its level (``switch_level``); ``always_on``
    samples and rotates it. An existing log at ``out`` is kept as ``out.old`` (``runner.keep_old``), unless ``append``. ``warmup``: the
    model warmed up first, as llama-server does (``runner.warm_up``)."""
    from llamacpp_instr.native import models
    from llamacpp_instr.running.api import InstrSession, session
    from llamacpp_instr.running.runner import check_writable, keep_old, resolve_threads, warm_up

    models.check_gguf(model)
    check_writable(out)
    check_port(host, port)
    try:
        import uvicorn
    except ImportError as exc:
        raise UserError(f"instr serve needs {exc.name}: {_SERVER_EXTRA_HINT}") from None
    api = bindings.load()
    always_on = always_on or AlwaysOn()
    offload = offload or Offload()
    tensors = tensors or TensorOverrides()
    placement = prepare(offload)  # before the model loads, and before the log exists
    if memory_budget:
        api.set_memory_budget(memory_budget)
    n_threads = resolve_threads(threads)
    app, llm = _load_app(model, host, port, n_ctx, n_threads, api, (placement, tensors))
    if warmup:
        warm_up(llm)  # as llama-server does
    use = instrument(llm, api)
    app.add_middleware(RequestRecorder, api=api)

    server_of = {"host": host, "port": port, "n_ctx": n_ctx, "threads": n_threads}
    metadata = _metadata(model, server_of, always_on, offload, tensors)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal: SIGINT becomes
    # KeyboardInterrupt, SIGTERM this exception, and the session ends as interrupted either way
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    s: InstrSession | None = None
    old = keep_old(out, append)  # the model loaded: the log is this server's
    if old is not None and on_ready:
        on_ready(f"the log that was at {out} is {old} (--append adds to it)")
    try:
        # the session users open around their own Llama
        with session(
            llm,
            out,
            level,
            top_k_logits=top_k_logits,
            value_stats=value_stats,
            metadata=metadata,
            **always_on.metadata(),
        ) as s:
            ready = (
                f"serving {model.name} on http://{host}:{port}/v1 (OpenAI-compatible); log: {out}"
            )
            _run_server(server, api, level, lambda: on_ready(ready) if on_ready else None)
    except KeyboardInterrupt:
        if s is None:  # before the session began
            raise
    finally:
        close_when_idle(llm, use)
    n_requests = sum(1 for _, rec in iter_records(out) if rec["type"] == "request")
    return ServeResult(log_path=out, status=s.status, requests=n_requests, steps=s.totals.steps)
