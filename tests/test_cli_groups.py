"""`instr --help` lists its commands in groups by job, at most 21 of them, and every old command
name (``cli.OLD_NAMES``) is still answered for one release: hidden from the help, with one note on
stderr, and the same result as the form that replaces it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import FIXTURES
from test_otlp import Receiver, hand_log

from llamacpp_instr.cli import GROUPS, OLD_NAMES, all_commands, main

LOG = FIXTURES / "tiny-llama-detailed.log.gz"


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def _listed(help_text: str) -> dict[str, list[str]]:
    """Each section of the help -> the names it lists (its rows' first words)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in help_text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and re.match(r"^  \S", line):
            current.append(line.split()[0])
    return sections


@pytest.mark.fast
def test_the_help_lists_at_most_21_commands_in_groups_by_job() -> None:
    r = _cli("--help")
    assert r.exit_code == 0
    sections = _listed(r.stdout)
    groups = {title: names for title, names in sections.items() if title != "Options"}
    assert list(groups) == [
        "Run a model",
        "Read a log",
        "Decide the next run",
        "Quantize",
        "Set up",
    ]
    assert groups == {title: list(names) for title, names in GROUPS.items()}
    listed = [n for names in groups.values() for n in names]
    assert len(listed) == len(set(listed)) <= 21
    # the names the README's users rely on are all there
    assert {"run", "serve", "exec", "to-perfetto", "summary", "compare", "quant-report"} <= set(
        listed
    )
    # every command is listed; an old name is an alias of a listed command, never a command
    commands = all_commands()
    assert set(commands) == set(listed)
    assert not any(c.hidden for c in commands.values())
    for old, alias in OLD_NAMES.items():
        assert old not in commands and alias.command in listed
        assert not re.search(rf"^  {old}\b", r.stdout, re.M)


def _note(old: str) -> str:
    return f"warning: instr {old} is now {OLD_NAMES[old].form}; the old name goes in the next release\n"


def _same_but_the_note(old: str, old_r: Any, new_r: Any) -> None:
    assert old_r.stderr.startswith(_note(old)), old_r.stderr
    assert old_r.stderr.count("warning: ") == 1
    assert "warning: " not in new_r.stderr
    assert old_r.exit_code == new_r.exit_code
    assert old_r.stdout == new_r.stdout
    assert old_r.stderr[len(_note(old)) :] == new_r.stderr


@pytest.mark.fast
def test_every_old_name_has_a_test_here() -> None:
    assert set(OLD_NAMES) == {"metrics", "to-otlp", "workloads", "tools", "demo"}


@pytest.mark.fast
def test_workloads_is_export_workloads(tmp_path: Path) -> None:
    new = _cli("export", str(LOG), "--workloads", "-o", str(tmp_path / "new.jsonl"))
    old = _cli("workloads", str(LOG), "-o", str(tmp_path / "old.jsonl"))
    assert new.exit_code == 0, new.output
    _same_but_the_note("workloads", old, new)
    text = (tmp_path / "new.jsonl").read_text()
    assert text.count("\n") > 10 and (tmp_path / "old.jsonl").read_text() == text


@pytest.mark.fast
def test_to_otlp_is_export_otlp(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    hand_log(log, 4)
    got = []
    for args in (["export", str(log), "--otlp"], ["to-otlp", str(log), "--endpoint"]):
        rx = Receiver()
        try:
            r = _cli(*args, rx.url, "--layers")
            names = sorted((s.name, len(s.attributes)) for s in rx.spans)
        finally:
            rx.close()
        got.append((r, names, rx.url))
    (new, new_spans, new_url), (old, old_spans, old_url) = got
    assert new.exit_code == 0 and "4 requests" in new.stderr, new.output
    assert len(new_spans) == 4 * 5 and old_spans == new_spans  # a request and 4 steps each
    old.stderr_bytes = old.stderr_bytes.replace(old_url.encode(), new_url.encode())
    _same_but_the_note("to-otlp", old, new)


@pytest.mark.fast
def test_metrics_is_follow_prometheus(tmp_path: Path) -> None:
    # the refusals before anything is served (test_metrics.py serves and scrapes with the new form)
    none = str(tmp_path / "none.log")
    new = _cli("follow", none, "--prometheus", ":0", "--wait", "0")
    old = _cli("metrics", none, "--listen", ":0")
    assert new.exit_code == 2 and new.stderr == f"error: log file not found: {none}\n"
    _same_but_the_note("metrics", old, new)
    new = _cli("follow", str(LOG), "--prometheus", "9400")
    old = _cli("metrics", str(LOG), "--listen", "9400")
    assert new.exit_code == 2 and new.stderr.startswith("error: --prometheus/--metrics wants")
    _same_but_the_note("metrics", old, new)


@pytest.mark.fast
def test_tools_is_doctor_tools() -> None:
    for more in ([], ["--vulkan"]):
        new = _cli("doctor", "--tools", *more)
        old = _cli("tools", *more)
        assert new.exit_code == 0 and "llama-server" in new.stdout, new.output
        _same_but_the_note("tools", old, new)


@pytest.mark.fast
def test_the_new_forms_refuse_options_of_another_form() -> None:
    for args in (
        ["doctor", "--tools", "--demo"],
        ["doctor", "--vulkan"],
        ["doctor", "-n", "4"],
        ["export", str(LOG), "--layers"],
        ["export", str(LOG), "--otlp", "http://127.0.0.1:1", "--workloads"],
    ):
        r = _cli(*args)
        assert r.exit_code == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1


def test_demo_is_doctor_demo(instr_api: Any, tmp_path: Path) -> None:
    new = _cli("doctor", "--demo", "-o", str(tmp_path / "new"), "-n", "2")
    old = _cli("demo", "-o", str(tmp_path / "old"), "-n", "2")
    assert new.exit_code == 0 and "log ok: " in new.stdout and "trace ok: " in new.stdout
    for r in (old, new):  # what differs between two runs: the directory, the trace's size
        for name in ("stdout_bytes", "stderr_bytes"):
            text = re.sub(rb"\S*/(new|old)/", b"DIR/", getattr(r, name))
            setattr(r, name, re.sub(rb"\d+ bytes", b"N bytes", text))
    _same_but_the_note("demo", old, new)
    assert (tmp_path / "old" / "demo.pftrace").stat().st_size > 0


@pytest.mark.fast
def test_an_old_name_without_its_required_option_is_refused() -> None:
    for old, option in (("to-otlp", "--endpoint"), ("metrics", "--listen")):
        r = _cli(old, str(LOG))
        assert r.exit_code == 2, r.output
        assert r.stderr == _note(old) + f"error: {option} is required\n"
