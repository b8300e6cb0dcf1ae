"""`instr run --chat/--system`, and prompts from a file or stdin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from gguf import GGUFReader
from helpers.support import read_log

from llamacpp_instr.cli import main


def _run(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(main, ["run", *args], input=input)


def _gguf_string(path: Path, key: str) -> str:
    field = GGUFReader(path).fields[key]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def test_chat_formats_with_the_models_own_template(
    instr_api: Any, smollm2_path: Path, tmp_path: Path
) -> None:
    import jinja2
    import llama_cpp

    log = tmp_path / "chat.log"
    r = _run(
        str(smollm2_path), "--chat", "--system", "Be brief.", "-p", "Name a color.",
        "-n", "4", "-o", str(log),
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    # the template as gguf-py reads it from the file, rendered with plain jinja2
    template = _gguf_string(smollm2_path, "tokenizer.chat_template")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a color."},
    ]
    expected = (
        jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        .from_string(template)
        .render(messages=messages, add_generation_prompt=True, bos_token="", eos_token="")
    )
    recs = read_log(log)
    assert recs[0]["metadata"]["formatted_prompt"] == expected
    assert "<|im_start|>system\nBe brief.<|im_end|>" in expected  # SmolLM2's ChatML
    # the prompt step decoded exactly that text's tokens
    vocab = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    want = vocab.tokenize(expected.encode(), add_bos=False, special=True)
    prompt_step = next(s for s in recs if s["type"] == "step_begin")
    assert prompt_step["tokens"] == want


def test_prompt_from_stdin_and_from_a_file(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    text = "hello from somewhere"
    f = tmp_path / "p.txt"
    f.write_text(text, encoding="utf-8")
    logs = {"stdin": tmp_path / "a.log", "file": tmp_path / "b.log", "arg": tmp_path / "c.log"}
    common = [str(tiny_llama_f32), "-n", "1", "--ignore-eos", "-t", "1"]
    assert _run(*common, "-p", "-", "-o", str(logs["stdin"]), input=text).exit_code == 0
    assert _run(*common, "--prompt-file", str(f), "-o", str(logs["file"])).exit_code == 0
    assert _run(*common, "-p", text, "-o", str(logs["arg"])).exit_code == 0
    first = {k: next(r for r in read_log(v) if r["type"] == "step_begin") for k, v in logs.items()}
    assert first["stdin"]["tokens"] == first["file"]["tokens"] == first["arg"]["tokens"]
    assert read_log(logs["file"])[0]["metadata"]["prompt"] == text


@pytest.mark.fast
@pytest.mark.parametrize(
    "args, needle",
    [
        (["-p", "x", "--prompt-file", "p.txt"], "exactly one of -p/--prompt and --prompt-file"),
        ([], "exactly one of -p/--prompt and --prompt-file"),
        (["--prompt-file", "missing.txt"], "prompt file not found: missing.txt"),
        (["--prompt-file", "latin1.txt"], "prompt file is not UTF-8 text: latin1.txt"),
        (["-p", "   "], "the prompt is empty"),
        (["-p", "x", "--system", "s"], "--system needs --chat"),
    ],
)
def test_bad_prompts_are_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], needle: str
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("p.txt").write_text("x")
    Path("latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    r = _run("nope.gguf", *args, "-o", "never.log")
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == f"error: {needle}" or needle in r.output
    assert not Path("never.log").exists()


def test_chat_without_a_template_is_refused_before_the_log(
    instr_api: Any, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    log = tmp_path / "never.log"
    r = _run(str(tiny_llama_f32), "--chat", "-p", "hi", "-o", str(log))
    assert r.exit_code == 2
    assert r.output.strip().splitlines()[-1] == (
        "error: the model has no chat template (tokenizer.chat_template in its GGUF): run it "
        "without --chat"
    )
    assert not log.exists()
