"""Run real generation through llama-cpp-python with an instrumentation session open."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from converters.errors import UserError
from llamacpp_instr import __version__, bindings, models


@dataclass
class RunConfig:
    model: Path
    prompt: str
    n_predict: int = 32
    threads: int | None = None
    n_ctx: int = 2048
    n_batch: int = 512
    n_ubatch: int | None = None
    level: str = "detailed"
    out: Path | None = None
    seed: int = 0
    temp: float = 0.0
    flash_attn: bool = False
    top_k_logits: int = 10
    ignore_eos: bool = False


@dataclass
class RunResult:
    text: str
    log_path: Path
    status: str
    n_steps: int
    n_tokens: int
    n_prompt_tokens: int
    n_generated: int
    token_ids: list[int] = field(default_factory=list)


def default_log_name() -> Path:
    import time

    return Path(time.strftime("llama_instrumentation_%Y%m%d_%H%M%S.log"))


def check_writable(path: Path) -> None:
    """Fail before loading the model, not after."""
    if path.is_dir():
        raise UserError(f"log path is a directory: {path}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write log {path}: directory {parent} does not exist")
    try:
        with path.open("ab"):
            pass
    except OSError as exc:
        raise UserError(f"cannot write log {path}: {exc.strerror}") from None


def load_model(cfg: RunConfig, **extra: Any) -> Any:
    """A llama_cpp.Llama for the config, or a one-line UserError."""
    models.check_gguf(cfg.model)
    llama_cpp = bindings.import_llama_cpp()
    threads = cfg.threads or max(1, min(os.cpu_count() or 1, 8))
    try:
        return llama_cpp.Llama(
            model_path=str(cfg.model),
            n_ctx=cfg.n_ctx,
            n_batch=cfg.n_batch,
            n_ubatch=cfg.n_ubatch or cfg.n_batch,
            n_threads=threads,
            n_threads_batch=threads,
            seed=cfg.seed,
            flash_attn=cfg.flash_attn,
            verbose=False,
            **extra,
        )
    except (ValueError, RuntimeError) as exc:
        raise UserError(models.explain_load_failure(cfg.model)) from exc


def run(cfg: RunConfig, on_text: Callable[[str], None] | None = None) -> RunResult:
    """Generate ``cfg.n_predict`` tokens with a session open; the log is valid whatever happens."""
    api = bindings.load()
    out = cfg.out or default_log_name()
    check_writable(out)
    llm = load_model(cfg)
    llama_cpp = bindings.import_llama_cpp()
    if cfg.n_predict < 0:
        raise UserError("-n must be >= 0")
    prompt_tokens = llm.tokenize(cfg.prompt.encode(), add_bos=True, special=False)
    if len(prompt_tokens) + cfg.n_predict > llm.n_ctx():
        raise UserError(
            f"prompt ({len(prompt_tokens)} tokens) + -n {cfg.n_predict} exceeds the context "
            f"({llm.n_ctx()}); raise --ctx"
        )

    metadata = {
        "tool": f"llamacpp-instr {__version__}",
        "command": "instr run",
        "model_path": str(cfg.model),
        "prompt": cfg.prompt,
        "prompt_tokens": len(prompt_tokens),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
    }
    api.set_topk(cfg.top_k_logits)
    api.session_begin(llm.ctx, str(out), cfg.level, metadata)

    status = "ok"
    text = bytearray()
    emitted = 0
    generated: list[int] = []
    try:
        llm.set_seed(cfg.seed)
        for token in llm.generate(prompt_tokens, temp=cfg.temp, reset=True):
            if not cfg.ignore_eos and llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
                break
            generated.append(int(token))
            text += llm.detokenize([token], prev_tokens=prompt_tokens + generated[:-1])
            # print only complete UTF-8 characters (a token can end mid-character)
            chunk = bytes(text[emitted:]).decode("utf-8", errors="ignore")
            if chunk and on_text:
                on_text(chunk)
            emitted += len(chunk.encode())
            if len(generated) >= cfg.n_predict:
                break
    except KeyboardInterrupt:
        status = "interrupted"
    except Exception:
        status = "error"
        raise
    finally:
        steps, tokens, _ = api.totals()
        api.session_end(status)
        llm.close()

    return RunResult(
        text=bytes(text).decode("utf-8", errors="replace"),
        log_path=out,
        status=status,
        n_steps=steps,
        n_tokens=tokens,
        n_prompt_tokens=len(prompt_tokens),
        n_generated=len(generated),
        token_ids=generated,
    )


def echo_stream(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
