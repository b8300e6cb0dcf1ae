"""Run real generation through llama-cpp-python with an instrumentation session open."""

from __future__ import annotations

import codecs
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.contract.schema import SESSION_LEVELS
from llamacpp_instr.contract.version import __version__
from llamacpp_instr.native import bindings, models
from llamacpp_instr.running import context_defaults
from llamacpp_instr.running import memory_budget as memory
from llamacpp_instr.running.always_on import AlwaysOn
from llamacpp_instr.running.media import Media, MediaInputs
from llamacpp_instr.running.offload import Offload, Placement, prepare
from llamacpp_instr.running.tensor_overrides import TensorOverrides


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
    # flash attention: on, off, or None for llama.cpp's default, auto (context_defaults)
    flash_attn: bool | None = None
    # before the session: decode BOS and EOS once and forget them (common's warm-up: warm_up)
    warmup: bool = True
    type_k: str = "f16"  # the KV cache's types (-ctk/-ctv), by ggml's names
    type_v: str = "f16"
    top_k_logits: int = 10
    value_stats: bool = False  # at verbose, each CPU op's output statistics (tensor_stats)
    ignore_eos: bool = False
    chat: bool = False
    system: str | None = None
    always_on: AlwaysOn = field(default_factory=AlwaysOn)  # sampling and bounded files
    append: bool = False  # add the session to an existing log (default: keep_old replaces it)
    # where the layers run (-ngl/--gpu-layers, --device, --rpc, --tensor-split)
    offload: Offload = field(default_factory=Offload)
    # --memory-budget, as the bytes spec the library reads (llamacpp_instr.running.memory_budget)
    memory_budget: str | None = None
    # which weight tensors go to which buffer type (-ot/--override-tensor, --n-cpu-moe, --cpu-moe)
    tensors: TensorOverrides = field(default_factory=TensorOverrides)
    # a projector and the images and sounds it reads into the prompt (--mmproj, --image, --audio)
    media: MediaInputs = field(default_factory=MediaInputs)

    def memory_setting(self) -> memory.Setting:
        """What the run asked of memory, for the out-of-memory message."""
        ngl = self.offload.gpu_layers
        n_layer, q4k_saving = memory.model_facts(str(self.model))
        return memory.Setting(
            n_ctx=self.n_ctx,
            n_ubatch=self.n_ubatch or self.n_batch,
            gpu_layers=ngl if isinstance(ngl, int) and ngl >= 0 else None,
            n_layer=n_layer,
            type_k=self.type_k,
            type_v=self.type_v,
            q4k_saving=q4k_saving,
            ctx_flag="--ctx",
            ubatch_flag="--ubatch",
        )

    def validate(self) -> None:
        """Reject bad values before the model loads and before any file is created."""
        checks = [
            (self.n_predict >= 0, f"-n/--n-predict must be >= 0, got {self.n_predict}"),
            (
                self.threads is None or self.threads >= 1,
                f"--threads must be >= 1, got {self.threads}",
            ),
            (self.n_ctx >= 1, f"--ctx must be >= 1, got {self.n_ctx}"),
            (self.n_batch >= 1, f"--batch must be >= 1, got {self.n_batch}"),
            (
                self.n_ubatch is None or 1 <= self.n_ubatch <= self.n_batch,
                f"--ubatch must be between 1 and --batch ({self.n_batch}), got {self.n_ubatch}",
            ),
            (self.level in SESSION_LEVELS, f"level must be one of {', '.join(SESSION_LEVELS)}"),
            (self.temp >= 0, f"--temp must be >= 0, got {self.temp}"),
            (
                1 <= self.top_k_logits <= 1000,
                f"--top-k-logits must be between 1 and 1000, got {self.top_k_logits}",
            ),
        ]
        checks.append((self.system is None or self.chat, "--system needs --chat"))
        for flag, kv in (
            ("-ctk/--cache-type-k", self.type_k),
            ("-ctv/--cache-type-v", self.type_v),
        ):
            checks.append(
                (kv in memory.KV_TYPES, f"{flag} must be one of {', '.join(memory.KV_TYPES)}")
            )
        checks.append(
            (
                self.type_v in ("f32", "f16", "bf16") or self.flash_attn is not False,
                f"a quantized V cache (-ctv {self.type_v}) needs flash attention (llama.cpp's "
                "rule): drop --no-flash-attn",
            )
        )
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        self.media.validate()


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
    old_log: Path | None = None  # where an existing log at the path went (keep_old)


def resolve_threads(threads: int | None) -> int:
    """The CPU threads to use: ``threads``, or by default all cores, at most 8 (past that, more
    threads mostly wait at the barrier between ops). The one default of every command's
    -t/--threads."""
    return threads or max(1, min(os.cpu_count() or 1, 8))


def default_log_name() -> Path:
    import time

    return Path(time.strftime("llama_instrumentation_%Y%m%d_%H%M%S.log"))


def check_writable(path: Path) -> None:
    """Fail before loading the model, not after, and without creating the file: a run that fails
    before its session opens leaves nothing behind."""
    if path.is_dir():
        raise UserError(f"log path is a directory: {path}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"cannot write log {path}: directory {parent} does not exist")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UserError(f"cannot write log {path}: permission denied")
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot create log {path}: directory {parent} is not writable")


def keep_old(path: Path, append: bool = False) -> Path | None:
    """Just before a session opens at ``path``: unless ``append``, an existing log moves to
    ``path.old`` (replacing an older one), as ``perf record`` keeps ``perf.data.old``, so that
    the log holds this run's session alone. Where the old log went; None if nothing moved."""
    if append or not path.is_file() or path.stat().st_size == 0:
        return None
    old = path.with_name(path.name + ".old")
    try:
        os.replace(path, old)
    except OSError as exc:
        raise UserError(f"cannot move the existing log {path} to {old}: {exc.strerror}") from None
    return old


class TextStream:
    """Generated bytes to printable text, as they come: a token can end inside a UTF-8 character,
    so bytes are held until the character completes; invalid bytes print once, as U+FFFD."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return str(self._decoder.decode(data))

    def close(self) -> str:
        return str(self._decoder.decode(b"", final=True))


def chat_prompt(llm: Any, prompt: str, system: str | None) -> tuple[list[int], str]:
    """The prompt as the model's own chat template formats it (its GGUF's
    tokenizer.chat_template, through llama-cpp-python's Jinja2ChatFormatter), tokenized."""
    text, add_bos = chat_text(llm, prompt, system)
    return llm.tokenize(text.encode(), add_bos=add_bos, special=True), text


def chat_text(llm: Any, prompt: str, system: str | None) -> tuple[str, bool]:
    """The prompt as the model's chat template formats it, and whether its tokens need the BOS
    token the template did not write."""
    from llama_cpp import llama_chat_format

    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        raise UserError(
            "the model has no chat template (tokenizer.chat_template in its GGUF): run it "
            "without --chat"
        )

    def text(token: int) -> str:
        return str(llm._model.token_get_text(token)) if token >= 0 else ""

    formatter = llama_chat_format.Jinja2ChatFormatter(
        template=template,
        eos_token=text(llm.token_eos()),
        bos_token=text(llm.token_bos()),
        stop_token_ids=[llm.token_eos()],
    )
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    try:
        formatted = formatter(messages=messages)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - a template error is the model's, say which
        raise UserError(f"the model's chat template failed: {exc}") from None
    # the template writes the BOS token itself when it wants one
    return str(formatted.prompt), not formatted.added_special


def kv_type_id(name: str) -> int:
    """ggml's type id of a KV cache type (llama_cpp.Llama's type_k/type_v)."""
    if name not in memory.KV_TYPES:
        raise UserError(
            f"unknown KV cache type {name!r}: choose one of {', '.join(memory.KV_TYPES)}"
        )
    return int(getattr(bindings.import_llama_cpp(), f"GGML_TYPE_{name.upper()}"))


def load_model(cfg: RunConfig, placement: Placement | None = None, **extra: Any) -> Any:
    """A llama_cpp.Llama for the config, placed by ``placement`` (default: prepared from
    ``cfg.offload``), or a one-line UserError."""
    models.check_gguf(cfg.model)
    llama_cpp = bindings.import_llama_cpp()
    placement = placement or prepare(cfg.offload)
    threads = resolve_threads(cfg.threads)
    failed_before = bindings.load().memory_failure()
    try:
        # the tensor overrides inside the placement's (serialized) loading
        with placement.loading(), cfg.tensors.loading(), context_defaults.opening(cfg.flash_attn):
            return llama_cpp.Llama(
                str(cfg.model),
                n_ctx=cfg.n_ctx,
                n_batch=cfg.n_batch,
                n_ubatch=cfg.n_ubatch or cfg.n_batch,
                n_threads=threads,
                n_threads_batch=threads,
                seed=cfg.seed,
                flash_attn=bool(cfg.flash_attn),  # auto: context_defaults.opening
                type_k=kv_type_id(cfg.type_k),
                type_v=kv_type_id(cfg.type_v),
                verbose=False,
                **extra,
            )
    except (ValueError, RuntimeError) as exc:
        oom = memory.explain(bindings.load(), failed_before, cfg.memory_setting())
        if oom is None and cfg.tensors:
            raise UserError(
                f"llama.cpp did not load {cfg.model} with the -ot/--n-cpu-moe rules "
                f"{' '.join(cfg.tensors.command_line()[1:])} (run it without them to tell "
                "whether the model or the rules are at fault)"
            ) from exc
        raise oom or UserError(models.explain_load_failure(cfg.model)) from exc


def warm_up(llm: Any) -> None:
    """llama.cpp's warm-up, as its programs run it after loading (common_init_from_params): the
    BOS and EOS tokens decoded once (the ones the vocabulary has, else token 0), then the memory
    cleared and the context's counters reset, so that the weights are read and a GPU's kernels
    loaded before the first step."""
    llama_cpp = bindings.import_llama_cpp()
    ctx = llm._ctx.ctx
    vocab = llm._model.vocab
    tokens = [
        t for t in (llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab)) if t >= 0
    ] or [0]
    tokens = tokens[: llm.n_batch]
    batch = (llama_cpp.llama_token * len(tokens))(*tokens)
    if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(batch, len(tokens))) != 0:
        raise RuntimeError("llama_decode failed in the warm-up")
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    llama_cpp.llama_synchronize(ctx)
    llama_cpp.llama_perf_context_reset(ctx)
    llm.reset()


@dataclass
class Prompt:
    """A run's prompt as the model takes it: its text (the chat template's, the media's markers),
    whether its tokens begin with BOS, its tokens (none with media: mtmd tokenizes it with them)
    and the positions it takes."""

    text: str
    add_bos: bool
    tokens: list[int]
    n_tokens: int

    @classmethod
    def of(cls, cfg: RunConfig, llm: Any, mm: Media | None) -> Prompt:
        """The prompt of ``cfg``, or a one-line error when it and -n overflow the context."""
        text = mm.with_markers(cfg.prompt) if mm else cfg.prompt
        add_bos = True
        if cfg.chat:
            text, add_bos = chat_text(llm, text, cfg.system)
        tokens: list[int] = []
        if mm:  # its positions, from a tokenizing no session sees (the session's is recorded)
            n = mm.positions(text, add_bos)
        else:
            tokens = llm.tokenize(text.encode(), add_bos=add_bos, special=cfg.chat)
            n = len(tokens)
        if n + cfg.n_predict > llm.n_ctx():
            raise UserError(
                f"prompt ({n} tokens) + -n {cfg.n_predict} exceeds the context "
                f"({llm.n_ctx()}); raise --ctx"
            )
        return cls(text, add_bos, tokens, n)


def run_metadata(cfg: RunConfig, p: Prompt) -> dict[str, Any]:
    """What session_start.metadata says of an ``instr run``."""
    return {
        "tool": f"llamacpp-instr {__version__}",
        "command": "instr run",
        "model_path": str(cfg.model),
        "prompt": cfg.prompt,
        "prompt_tokens": p.n_tokens,
        **cfg.media.metadata(),
        **({"chat": True, "system": cfg.system, "formatted_prompt": p.text} if cfg.chat else {}),
        "config": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in asdict(cfg).items()
            if k != "media"  # (its paths are the metadata's "media")
        },
        # flash attention as asked (auto: llama.cpp's default); the context record says what
        # llama.cpp used
        "flash_attn_type": context_defaults.flash_attn_name(cfg.flash_attn),
    }


def run(cfg: RunConfig, on_text: Callable[[str], None] | None = None) -> RunResult:
    """Generate ``cfg.n_predict`` tokens with a session open; the log is valid whatever happens.

    Raises ``bindings.SessionError`` after generating if the log lost records (a full disk, a
    removed file): the text was produced, but the log is incomplete.
    """
    from llamacpp_instr.running.api import InstrSession, session

    cfg.validate()
    out = cfg.out or default_log_name()
    check_writable(out)
    models.check_gguf(cfg.model)
    # the patched build, before the model loads; the log will hold its upload to RPC servers
    lib = bindings.load()
    lib.record_transfers()
    # RPC servers answer and devices exist, before the model loads (and before any log exists)
    placement = prepare(cfg.offload)
    if cfg.memory_budget:
        lib.set_memory_budget(cfg.memory_budget)  # on devices that exist now (RPC0...)
    llm = load_model(cfg, placement)
    failed_before = lib.memory_failure()
    llama_cpp = bindings.import_llama_cpp()
    stream = TextStream()
    text: list[str] = []
    generated: list[int] = []
    s: InstrSession | None = None
    old: Path | None = None
    mm: Media | None = None

    def emit(chunk: str) -> None:
        if chunk:
            text.append(chunk)
            if on_text:
                on_text(chunk)

    try:
        # the projector and the media, checked against the model before any log exists
        threads = resolve_threads(cfg.threads)
        mm = Media(llm, cfg.media, threads, cfg.flash_attn) if cfg.media else None
        # mtmd loads a projector whose compute buffer did not fit (its warm-up ignores the
        # failure) and faults at its first encode: refused here, with what did not fit
        oom = memory.explain(lib, failed_before, cfg.memory_setting()) if mm else None
        if oom is not None:
            raise oom
        if cfg.warmup:
            warm_up(llm)
        p = Prompt.of(cfg, llm, mm)
        prompt_tokens = p.tokens
        old = keep_old(out, cfg.append)  # the model loaded: the log is this run's
        # the session users open around their own Llama (api.session): it ends as interrupted on
        # Ctrl-C, which then ends the run with what was generated so far
        with session(
            llm,
            out,
            cfg.level,
            top_k_logits=cfg.top_k_logits,
            value_stats=cfg.value_stats,
            metadata=run_metadata(cfg, p),
            **cfg.always_on.metadata(),
        ) as s:
            llm.set_seed(cfg.seed)
            if mm:  # the media's encodes and the decode of every chunk but the last token
                llm.reset()
                prompt_tokens = mm.evaluate(p.text, p.add_bos)
            for token in llm.generate(prompt_tokens, temp=cfg.temp, reset=True):
                if not cfg.ignore_eos and llama_cpp.llama_vocab_is_eog(llm._model.vocab, token):
                    break
                generated.append(int(token))
                piece = llm.detokenize([token], prev_tokens=prompt_tokens + generated[:-1])
                emit(stream.feed(piece))
                if len(generated) >= cfg.n_predict:
                    break
            emit(stream.close())
    except KeyboardInterrupt:
        if s is None:  # before the session began: nothing was run
            raise
    except RuntimeError as exc:
        # llama_decode failed: a compute buffer that did not fit (the log holds the failure)
        oom = memory.explain(lib, failed_before, cfg.memory_setting())
        if oom is None:
            raise
        raise oom from exc
    finally:
        if mm:
            mm.close()
        llm.close()

    assert s is not None  # the session began, or the exception propagated
    return RunResult(
        text="".join(text),
        log_path=out,
        status=s.status,
        n_steps=s.totals.steps,
        n_tokens=s.totals.tokens,
        n_prompt_tokens=p.n_tokens,
        n_generated=len(generated),
        token_ids=generated,
        old_log=old,
    )


def echo_stream(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run_watched(
    cfg: RunConfig, watch: Callable[[Path, float, threading.Event], object]
) -> RunResult:
    """``run``, while a second thread watches the log from its start: ``watch(log, wait, stop)``
    (``instr run --live``: the live view of ``instr follow``), ``stop`` set when the run ends.
    The log must be new: an earlier session in it would be watched too (an existing log is
    kept as LOG.old first, unless ``cfg.append``, which --live refuses)."""
    cfg.validate()
    if cfg.out is None:
        cfg.out = default_log_name()
    if cfg.append and cfg.out.exists() and cfg.out.stat().st_size > 0:
        raise UserError(f"--live needs a new log file; {cfg.out} exists (drop --append)")
    check_writable(cfg.out)
    models.check_gguf(cfg.model)  # a run that cannot start leaves the old log where it is
    old = keep_old(cfg.out)
    stop = threading.Event()
    viewer = threading.Thread(target=watch, args=(cfg.out, 600.0, stop), daemon=True)
    viewer.start()
    try:
        result = run(cfg)
        result.old_log = result.old_log or old
        return result
    finally:
        stop.set()
        viewer.join(timeout=5)
