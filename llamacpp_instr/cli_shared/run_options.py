"""The options of what ``instr run`` generates: the prompt (-p, --prompt-file, --chat, --system)
and the images and sounds in it (--mmproj, --image, --audio), how much and how (-n, --seed,
--temp, --ignore-eos), and the graphs that compute it (--batch, --ubatch, --flash-attn)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.running.context_choices import LLAMA_N_BATCH, LLAMA_N_UBATCH

F = TypeVar("F", bound=Callable[..., Any])


def _options(options: list[Callable[[Any], Any]], f: Any) -> Any:
    """``f`` with ``options``, in the help in their order."""
    for option in reversed(options):
        f = option(f)
    return f


def prompt_options(f: F) -> F:
    """-p/--prompt, --prompt-file, --chat and --system: the prompt read (``read_prompt``) and
    given to the command as ``prompt``, its text."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["prompt"] = read_prompt(kwargs.pop("prompt"), kwargs.pop("prompt_file"))
        return f(*args, **kwargs)

    options = [
        click.option("-p", "--prompt", default=None, help="Prompt text; - reads it from stdin."),
        click.option(
            "--prompt-file",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="Read the prompt from this file (UTF-8).",
        ),
        click.option(
            "--chat",
            is_flag=True,
            help="Format the prompt with the model's own chat template (its GGUF's "
            "tokenizer.chat_template) as a user message.",
        ),
        click.option("--system", default=None, help="A system message, with --chat."),
    ]
    return _options(options, wrapper)  # type: ignore[no-any-return]


def media_options(f: F) -> F:
    """--mmproj, --image, --audio and --no-mmproj-offload, given to the command as ``media`` (a
    MediaInputs)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from llamacpp_instr.running.run_config import MediaInputs

        kwargs["media"] = MediaInputs(
            kwargs.pop("mmproj"),
            tuple(kwargs.pop("images")),
            tuple(kwargs.pop("audio")),
            offload=not kwargs.pop("no_mmproj_offload"),
        )
        return f(*args, **kwargs)

    def path(*names: str, **kw: Any) -> Callable[[Any], Any]:
        return click.option(*names, type=click.Path(path_type=Path, dir_okay=False), **kw)

    options = [
        path(
            "--mmproj",
            default=None,
            help="The model's multimodal projector (an mmproj GGUF, as llama-mtmd-cli takes): "
            "each image's and sound's load, preprocessing, encode (every op) and decode are "
            "recorded.",
        ),
        path(
            "--image",
            "images",
            multiple=True,
            help="An image for the prompt (JPEG, PNG, GIF, BMP, PNM; repeatable). Its marker "
            "<__media__> in the prompt places it; without one the media come first.",
        ),
        path(
            "--audio",
            "audio",
            multiple=True,
            help="A sound, where the projector hears (WAV, MP3, FLAC; repeatable).",
        ),
        click.option(
            "--no-mmproj-offload",
            "no_mmproj_offload",
            is_flag=True,
            help="Keep the projector's encoder on the CPU, as llama.cpp's own option does "
            "(default: the first --device, else the first GPU, as `instr fit --mmproj` places "
            "it).",
        ),
    ]
    return _options(options, wrapper)  # type: ignore[no-any-return]


def generation_options(f: F) -> F:
    """-n/--n-predict, --seed, --temp and --ignore-eos."""
    options = [
        click.option(
            "-n",
            "--n-predict",
            type=click.IntRange(min=0),
            default=32,
            show_default=True,
            help="Tokens to generate.",
        ),
        click.option("--seed", default=0, show_default=True, help="Sampling seed."),
        click.option(
            "--temp",
            type=click.FloatRange(min=0.0),
            default=0.0,
            show_default=True,
            help="Sampling temperature (0 = greedy).",
        ),
        click.option(
            "--ignore-eos",
            is_flag=True,
            help="Keep generating past end-of-sequence (fixed-length runs).",
        ),
    ]
    return _options(options, f)  # type: ignore[no-any-return]


def graph_options(f: F) -> F:
    """--batch, --ubatch and --flash-attn: the graphs llama.cpp computes, by default as llama.cpp's
    own programs compute them. ``n_ubatch`` reaches the command resolved: llama.cpp's, or --batch
    where that is smaller (llama.cpp clamps it so)."""
    options = [
        click.option(
            "--batch",
            "n_batch",
            type=click.IntRange(min=1),
            default=LLAMA_N_BATCH,
            show_default=True,
            help="Tokens per llama_decode call (llama.cpp's n_batch).",
        ),
        click.option(
            "--ubatch",
            "n_ubatch",
            type=click.IntRange(min=1),
            default=None,
            help=f"Tokens per graph compute (default: {LLAMA_N_UBATCH}, llama.cpp's n_ubatch, or "
            "--batch where that is smaller).",
        ),
        click.option(
            "--flash-attn/--no-flash-attn",
            default=None,
            help="Flash attention on, or off: --no-flash-attn shows attention as separate KQ, "
            "soft_max and KQV ops, each timed on its own (default: llama.cpp's auto, on where "
            "every device the layers run on supports it, as on the CPU; the log and instr "
            "summary say what was used).",
        ),
    ]

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if kwargs["n_ubatch"] is None:
            kwargs["n_ubatch"] = min(LLAMA_N_UBATCH, kwargs["n_batch"])
        return f(*args, **kwargs)

    return _options(options, wrapper)  # type: ignore[no-any-return]


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt from exactly one of -p TEXT, -p - (stdin) and --prompt-file."""

    if (prompt is None) == (prompt_file is None):
        raise UserError("give the prompt with exactly one of -p/--prompt and --prompt-file")
    if prompt_file is not None:
        try:
            text = prompt_file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UserError(f"prompt file not found: {prompt_file}") from None
        except UnicodeDecodeError:
            raise UserError(f"prompt file is not UTF-8 text: {prompt_file}") from None
        except OSError as exc:
            raise UserError(f"cannot read prompt file {prompt_file}: {exc.strerror}") from None
    elif prompt == "-":
        text = sys.stdin.read()  # (click 8.5 deprecates get_text_stream)
    else:
        text = prompt or ""
    if not text.strip():
        raise UserError("the prompt is empty")
    return text
