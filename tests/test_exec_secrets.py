"""A secret on a program's command line stays out of its session log. The log records the command
line (session_start's metadata.argv, read from the kernel's copy of it); llama.cpp's arguments
that take a secret (llama-server's --api-key, the Hugging Face token --hf-token or -hft) keep
their name there and lose their value ("***"). --api-key-file names a path, which is kept.

A real llama-server, started by `instr exec` with a key, a token and a key file, answers requests
that carry a key; then every byte of its log is searched for each secret."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers.support import by_type, exec_server, read_log, signal_server

pytestmark = pytest.mark.native

KEY, FILE_KEY, TOKEN = "sk-instr-test-key-5150", "sk-instr-file-key-8086", "hf_instrTestToken6502"


def _complete(port: int, key: str) -> int:
    """The status of a one-token completion that carries ``key``."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        json.dumps({"prompt": "Hi", "n_predict": 1}).encode(),
        {"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return int(r.status)


def test_a_servers_keys_are_in_no_byte_of_its_log(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"# the server's second key\n{FILE_KEY}\n")
    log = tmp_path / "keyed.log"
    proc, port = exec_server(
        log, smollm2_path, "-t", "1", "--api-key", KEY, "-hft", TOKEN,
        "--api-key-file", str(key_file),
    )  # fmt: skip
    try:
        # both keys are the server's (it read them), and each request is recorded
        assert [_complete(port, k) for k in (KEY, FILE_KEY)] == [200, 200]
    finally:
        signal_server(proc)
        proc.wait(120)
    recs: list[dict[str, Any]] = read_log(log)
    assert len(by_type(recs, "request")) == 2
    argv = recs[0]["metadata"]["argv"]
    at = {word: k for k, word in enumerate(argv)}
    assert argv[at["--api-key"] + 1] == argv[at["-hft"] + 1] == "***", argv
    assert argv[at["--api-key-file"] + 1] == str(key_file), argv
    assert argv[at["-m"] + 1] == str(smollm2_path), argv  # (other values are kept)
    text = log.read_bytes()
    for secret in (KEY, FILE_KEY, TOKEN):
        assert secret.encode() not in text, secret
