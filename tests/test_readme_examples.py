"""The README's examples for the API, --chat and serve, run as written (in a temporary folder)."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import free_port, wait_ready

from llamacpp_instr.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def example(name: str) -> str:
    """The block right after <!-- example:NAME -->: a ```python fence or indented shell lines."""
    text = README.read_text(encoding="utf-8")
    after = text.split(f"<!-- example:{name} -->\n", 1)[1]
    if after.startswith("```python\n"):
        return after[len("```python\n") :].split("\n```", 1)[0]
    lines = []
    for line in after.splitlines():
        if not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines)


def test_api_example(instr_api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = subprocess.run(
        [sys.executable, "-c", example("api")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    recs = [json.loads(line) for line in (tmp_path / "app.log").open()]
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "ok"
    steps = sum(r["type"] == "step_begin" for r in recs)
    assert f"app.log ok {steps} steps" in r.stdout


def test_chat_example(instr_api: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("prompt.txt").write_text("A prompt from a file.")
    for line in example("chat").splitlines():
        if "|" in line:  # echo ... | instr run -p -
            text, cmd = line.split("|", 1)
            stdin = shlex.split(text)[1] + "\n"
        else:
            cmd, stdin = line, None
        argv = shlex.split(cmd)
        assert argv[0] == "instr"
        r = CliRunner().invoke(main, argv[1:], input=stdin)
        assert r.exit_code == 0, (line, r.output)
    meta = json.loads(Path("chat.log").open().readline())["metadata"]
    assert meta["chat"] and meta["system"] == "Answer in one word."


def test_serve_example(instr_api: Any, tmp_path: Path) -> None:
    """`instr serve --port 8000 -o serve.log` and the README's client, as written; on another
    port only if 8000 is taken on this machine."""
    client = example("serve-client")
    port = 8000
    try:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 8000))
    except OSError:
        port = free_port()
        client = client.replace(":8000/", f":{port}/")
    argv = shlex.split(
        next(ln for ln in README.read_text().splitlines() if ln.strip().startswith("instr serve "))
    )
    argv = [a if a != "8000" else str(port) for a in argv]
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamacpp_instr.cli", *argv[1:]],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(port, proc)
        r = subprocess.run(
            [sys.executable, "-c", client], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0 and r.stdout.strip(), r.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    recs = [json.loads(line) for line in (tmp_path / "serve.log").open()]
    assert [r["endpoint"] for r in recs if r["type"] == "request" and r["method"] == "POST"] == [
        "/v1/chat/completions"
    ]
    assert recs[-1]["status"] == "interrupted"


@pytest.mark.fast
def test_readme_stays_short_and_its_links_resolve() -> None:
    """The README is the front page (at most 400 lines; detail lives in docs/), and every relative
    link in it and in docs/ names a file that exists, and a heading of that page where it names
    one (``#anchor``, as GitHub makes them)."""
    root = README.parent
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 400
    checked = anchors = 0
    for page in (README, *sorted((root / "docs").glob("*.md"))):
        text = page.read_text(encoding="utf-8")
        targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'(?:href|src)="([^"]+)"', text)
        for target in targets:
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name} links to missing {target}"
            checked += 1
            if anchor and linked.suffix == ".md":
                heads = heading_anchors(linked)
                assert anchor in heads, f"{page.name} links to {target}: no such heading"
                anchors += 1
    assert checked >= 30 and anchors >= 5  # the patterns found the links at all


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``: lower case, punctuation but ``-`` and ``_``
    dropped, spaces as ``-``; a repeated one gets ``-1``, ``-2``..."""
    seen: dict[str, int] = {}
    found = set()
    fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
        if fence or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found
