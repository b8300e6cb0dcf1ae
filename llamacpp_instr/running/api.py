"""Profile your own llama-cpp-python program: a session around any ``llama_cpp.Llama``.

    import llama_cpp, llamacpp_instr

    llm = llama_cpp.Llama("model.gguf")
    with llamacpp_instr.session(llm, "run.log") as s:
        llm("The capital of France is", max_tokens=16)
        llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])
    print(s.path, s.totals.steps)

Everything every ``Llama`` does inside the block is logged (the instrumentation sits in
libllama, below llama-cpp-python): completions, chat, streaming, embeddings. The first ``Llama``
given describes the model in ``session_start``; other ``Llama`` objects used in the block are
logged too, one context id each. Leaving the block ends the session: ``ok``, ``interrupted`` on
KeyboardInterrupt, ``error`` on any other exception (which propagates); the log is valid in every
case.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import SESSION_LEVELS
from llamacpp_instr.contract.version import __version__
from llamacpp_instr.native import bindings
from llamacpp_instr.running import context_defaults, sampler_counters
from llamacpp_instr.running.always_on import AlwaysOn


@dataclass
class Totals:
    """What a session recorded (llama_instr_session_totals)."""

    steps: int = 0
    tokens: int = 0
    prompt_tokens: int = 0
    gen_tokens: int = 0
    computes: int = 0
    records: int = 0
    lost: int = 0


@dataclass
class InstrSession:
    """The open (then ended) session: where its log is and what it holds."""

    path: Path
    level: str
    status: str = "open"
    _totals: Totals = field(default_factory=Totals)

    @property
    def totals(self) -> Totals:
        """Live while the session is open, final after it ended."""
        if self.status == "open":
            self._totals = _read_totals()
        return self._totals


def _read_totals() -> Totals:
    t = bindings.load().totals()
    return Totals(
        steps=t.n_steps,
        tokens=t.n_tokens,
        prompt_tokens=t.n_prompt_tokens,
        gen_tokens=t.n_gen_tokens,
        computes=t.n_computes,
        records=t.n_records,
        lost=t.n_lost,
    )


def _ctx_of(llm: Any) -> Any:
    ctx = getattr(llm, "ctx", None)
    if ctx is None:
        raise UserError(f"not a llama_cpp.Llama with a context: {type(llm).__name__}")
    return ctx


def record_transfers(on: bool = True) -> bool:
    """Log what is sent to RPC servers before the next session opens: call it before loading a
    model whose layers go to RPC devices, and the session's log begins with the model's upload
    (``transfers`` records of phase ``load``). False when the build has no RPC backend."""
    return bindings.load().record_transfers(on)


def set_memory_budget(budget: str | dict[str, int] | None) -> None:
    """Make devices behave as if they had only this much memory, for the rest of the process:
    ``"CPU=2G,Vulkan0=512M"`` or ``{"CPU": 2 << 30}``; None removes it. A buffer beyond a
    device's budget then fails to allocate as it would on a device out of memory, and
    llama.cpp's own memory query reports the budget. Set it before loading the model."""
    from llamacpp_instr.running import memory_budget as memory

    if budget is None:
        spec = ""
    elif isinstance(budget, dict):
        spec = memory.format_budget(budget)
    else:
        spec = memory.format_budget(memory.parse_budget(budget))
    bindings.load().set_memory_budget(spec)


def memory_failure() -> str | None:
    """The last allocation that failed in this process, in one line: where, what it was for,
    what was free and held there, and what would free how much (None if none failed). The
    same line ``instr run`` ends with when a model or context does not fit."""
    from llamacpp_instr.running import memory_budget as memory

    failure = bindings.load().memory_failure()
    return None if failure is None else memory.message(failure)


@contextmanager
def session(
    llm: Any | Sequence[Any] | None,
    path: str | Path,
    level: str = "detailed",
    *,
    top_k_logits: int = 10,
    value_stats: bool = False,
    metadata: dict[str, Any] | None = None,
    sample: int = 1,
    sample_requests: int = 1,
    max_bytes: int = 0,
    keep: int | None = None,
) -> Iterator[InstrSession]:
    """Log everything ``llm`` (a ``llama_cpp.Llama``, several, or None) does inside the block.

    ``level``: minimal, detailed or verbose; at verbose, ``value_stats`` adds each CPU op's
    output statistics (``tensor_stats``; it sets LLAMA_INSTR_VALUE_STATS in this process's
    environment, which the library reads once per session). ``metadata`` (JSON-serializable) is stored in
    session_start, with who opened the session: ``"command"`` (``instr run`` and ``instr serve``
    open their sessions here too and say which they are) or else ``"api"``. A second session while
    one is open is an error (one per process).

    Always on (``llamacpp_instr.running.always_on``): ``sample`` records one decode step in N at ``level``
    and the others at minimal; ``sample_requests`` the steps of one request in N (requests begun
    with ``bindings.InstrLib.request_begin``); ``max_bytes`` rotates the log at that size, keeping
    ``keep`` older files (default 8); ``reopen()`` reopens it at its path (after logrotate).
    """
    always_on = AlwaysOn.of(sample, sample_requests, max_bytes, keep)
    if level not in SESSION_LEVELS:
        raise UserError(f"level must be one of {', '.join(SESSION_LEVELS)}, not {level!r}")
    llms = [] if llm is None else list(llm) if isinstance(llm, (list, tuple)) else [llm]
    ctxs = [_ctx_of(x) for x in llms]
    try:
        # allow_nan=False: NaN is not JSON, and the library refuses it
        meta = json.loads(json.dumps(metadata or {}, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise UserError(f"metadata must be JSON-serializable (no NaN or infinity): {exc}") from None
    meta.setdefault("tool", f"llamacpp-instr {__version__}")
    if "command" not in meta:
        meta.setdefault("api", "llamacpp_instr.session")
    api = bindings.load()
    api.set_topk(top_k_logits)
    os.environ["LLAMA_INSTR_VALUE_STATS"] = "1" if value_stats else "0"
    always_on.apply(api)
    out = Path(path)
    api.session_begin(ctxs[0] if ctxs else None, str(out), level, meta)
    s = InstrSession(path=out, level=level)
    status = "ok"
    try:
        with sampler_counters.counting():  # llama.cpp's own measure, in the `chain` records
            yield s
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except BaseException:
        status = "error"
        raise
    finally:
        # a step whose records wait for its context's synchronization (a GPU's) is written at it:
        # each context given is synchronized, on this thread, before the session ends
        _synchronize(ctxs)
        s._totals = _read_totals()
        s.status = status
        api.session_end(status)


def _synchronize(ctxs: list[Any]) -> None:
    llama_cpp = bindings.import_llama_cpp()
    for ctx in ctxs:
        if ctx:
            llama_cpp.llama_synchronize(ctx)


def llama_defaults(flash_attn: bool | None = None) -> AbstractContextManager[None]:
    """Inside the block, every ``llama_cpp.Llama`` made opens its context with flash attention as
    llama.cpp's own programs do by default, ``auto`` (on where every device supports it), and not
    llama-cpp-python's off; ``flash_attn`` True or False forces it (False: attention as separate
    KQ, soft_max and KQV ops). ``instr run`` and ``instr serve`` open theirs so::

        with llamacpp_instr.llama_defaults():
            llm = llama_cpp.Llama("model.gguf")
    """
    return context_defaults.opening(flash_attn)


def reopen() -> None:
    """Reopen the open session's log at its path at the next step boundary (after logrotate
    moved it; safe to call from a signal handler)."""
    bindings.load().reopen()
