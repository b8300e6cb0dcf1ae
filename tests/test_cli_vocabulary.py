"""One option vocabulary (issue 22): each option name means one thing in every command, and the old
spellings keep working for a release, each with a deprecation warning.

The old spellings of the commands that run a model are tested beside their commands: ``run --out``
here on a tiny model, ``serve --out`` in test_serve.py, ``quant-sweep --ctx`` in
test_quant_sweep.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES, read_log

from llamacpp_instr.cli import all_commands, main

LOG = FIXTURES / "tiny-llama-detailed.log.gz"

# options whose type, default and help must be the same wherever they appear
SAME_EVERYWHERE = ["--session", "--threads", "--ctx", "--top", "--strict", "--level"]
SAME_EVERYWHERE += ["--gpu-layers", "--device", "--rpc", "--tensor-split"]


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _visible_options() -> dict[str, list[tuple[str, click.Option]]]:
    """Each option string (-o, --output...) -> the (command, option) pairs that take it."""
    seen: dict[str, list[tuple[str, click.Option]]] = {}
    for name, cmd in all_commands().items():
        if cmd.hidden:  # an old name (cli.OLD_NAMES), answered for one release
            continue
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                for opt in p.opts + p.secondary_opts:
                    seen.setdefault(opt, []).append((name, p))
    return seen


@pytest.mark.fast
def test_each_option_name_means_one_thing() -> None:
    seen = _visible_options()
    for opt in SAME_EVERYWHERE:
        assert len(seen[opt]) >= 2, opt  # shared, or this test checks nothing
    for opt, uses in seen.items():
        # one destination and the same spellings: -o is always --output, never --out or --out-dir
        assert len({(p.name, tuple(p.opts)) for _, p in uses}) == 1, (opt, uses)
    for opt in SAME_EVERYWHERE:
        # fit's --ctx is a context size too, the largest it considers: by default the model's own
        # n_ctx_train, so its default and help are its own
        kinds = {
            (repr(p.type), p.default, p.help) for c, p in seen[opt] if (c, opt) != ("fit", "--ctx")
        }
        assert len(kinds) == 1, (opt, kinds)
    # the context size only (plan's: the one every setting it ranks must hold)
    assert {c for c, _ in seen["--ctx"]} == {"run", "serve", "fit", "plan"}
    # where a model's layers run: every command that loads a model (fit, predict and plan load
    # it without its weights); peaks and doctor load none (peaks measures --device's devices; doctor
    # lists the devices, --rpc's too)
    loads_a_model = {"run", "serve", "quant-eval", "quant-sweep", "fit", "predict", "plan"}
    assert seen["-ngl"] == seen["--gpu-layers"]
    assert {c for c, _ in seen["--gpu-layers"]} == loads_a_model
    assert {c for c, _ in seen["--tensor-split"]} == loads_a_model
    assert {c for c, _ in seen["--device"]} == loads_a_model | {"peaks"}
    assert {c for c, _ in seen["--rpc"]} == loads_a_model | {"peaks", "doctor"}
    assert {c for c, _ in seen["--strict"]} >= {"summary", "compare", "export"}
    assert seen["-o"] == seen["--output"] and len(seen["-o"]) >= 12
    for gone in ("--out", "--out-dir"):
        assert gone not in seen


@pytest.mark.fast
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_quant_report_session_is_the_old_spelling_of_log(fmt: str) -> None:
    new = _cli("quant-report", "--log", str(LOG), "--format", fmt)
    old = _cli("quant-report", "--session", str(LOG), "--format", fmt)
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert "deprecated" not in new.stderr
    assert old.stderr.startswith("warning: --session is deprecated") and "use --log" in old.stderr
    assert old.stdout == new.stdout and "tiny-llama-f32" in new.stdout


@pytest.mark.fast
def test_old_and_new_spelling_together_is_a_usage_error() -> None:
    r = _cli("quant-report", "--log", str(LOG), "--session", str(LOG))
    assert r.exit_code == 2
    assert "error: --session is the old spelling of --log: give one of them" in r.stderr


@pytest.mark.fast
def test_export_out_dir_is_the_old_spelling_of_output(tmp_path: Path) -> None:
    new = _cli("export", str(LOG), "--format", "csv", "-o", str(tmp_path / "new"))
    old = _cli("export", str(LOG), "--format", "csv", "--out-dir", str(tmp_path / "old"))
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert "warning: --out-dir is deprecated" in old.stderr and "use -o/--output" in old.stderr
    names = sorted(p.name for p in (tmp_path / "new").iterdir())
    assert "steps.csv" in names and "ops.csv" in names
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == names
    for n in names:
        assert (tmp_path / "old" / n).read_bytes() == (tmp_path / "new" / n).read_bytes()


@pytest.mark.fast
def test_demo_out_dir_is_wired_to_output(tmp_path: Path) -> None:
    # both spellings at once: refused before anything runs (the run itself is test_run's demo test)
    r = _cli("demo", "-o", str(tmp_path / "a"), "--out-dir", str(tmp_path / "b"))
    assert r.exit_code == 2 and "--out-dir is the old spelling of -o/--output" in r.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_run_out_is_the_old_spelling_of_output(
    tiny_llama_f32: Path, tmp_path: Path, instr_api: Any
) -> None:
    log = tmp_path / "old.log"
    r = _cli("run", str(tiny_llama_f32), "-p", "Hello", "-n", "2", "-t", "1", "--out", str(log))
    assert r.exit_code == 0, r.output
    assert "warning: --out is deprecated" in r.stderr and "use -o/--output" in r.stderr
    recs = read_log(log)
    assert recs[0]["metadata"]["config"]["out"] == str(log)
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "ok"


def test_quant_eval_ctx_is_the_old_spelling_of_chunk_size(
    tiny_llama_f32: Path, tiny_llama_q8: Path
) -> None:
    args = ["quant-eval", str(tiny_llama_f32), str(tiny_llama_q8), "--chunks", "2", "-t", "1"]
    args += ["--format", "json"]
    new = _cli(*args, "--chunk-size", "32")
    old = _cli(*args, "--ctx", "32")
    assert new.exit_code == 0 and old.exit_code == 0, old.output
    assert "warning: --ctx is deprecated" in old.stderr and "use --chunk-size" in old.stderr
    a, b = json.loads(new.stdout), json.loads(old.stdout)
    assert a["ctx"] == 32 and a["tokens_scored"] == 2 * (32 - 1 - 16)
    a.pop("seconds"), b.pop("seconds")
    assert a == b


def _damaged(tmp_path: Path) -> Path:
    """The fixture log with one line cut in half in the middle (a crash mid-write, then more)."""
    lines = gzip.open(LOG, "rt", encoding="utf-8").read().splitlines(keepends=True)
    mid = len(lines) // 2
    lines[mid] = lines[mid][: len(lines[mid]) // 2] + "\n"
    path = tmp_path / "damaged.log"
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.mark.fast
@pytest.mark.parametrize(
    "args",
    [["summary"], ["export", "--workloads"], ["export", "--format", "csv", "-o", "OUT"]]
    + [["compare", "SELF"]],
)
def test_strict_refuses_a_damaged_log(args: list[str], tmp_path: Path) -> None:
    log = _damaged(tmp_path)
    cmd = [args[0], str(log)] + [
        str(log) if a == "SELF" else str(tmp_path / "out") if a == "OUT" else a for a in args[1:]
    ]
    lenient = _cli(*cmd)
    assert lenient.exit_code == 0, lenient.output
    assert "skipped" in lenient.stderr  # the damage is reported, not hidden
    strict = _cli(*cmd, "--strict")
    assert strict.exit_code == 2 and strict.stderr.startswith("error: ")
    assert str(log) in strict.stderr and len(strict.stderr.strip().splitlines()) == 1
