"""llama.cpp's own programs, built by `instr build --tools` and run with LLAMA_INSTR_LOG: llama-server
driven by the real `openai` client (4 concurrent requests, 2 slots, one streamed, then SIGINT),
llama-cli with a one-shot prompt and llama-bench with a short pp/tg pair. Every log validates
against the schema and converts with no problem; llama-server's requests are found in the steps'
`seqs` and decode exactly the tokens they count.

The tools are built once per test session (cached under ~/.cache/llamacpp-instr/tools/, keyed by
the patches: a second run starts at once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.support import (
    converts_cleanly,
    free_port,
    gguf_kv_bytes,
    live_buffers,
    signal_server,
    wait_ready,
)

from llamacpp_instr.cli import main
from llamacpp_instr.converters.reports import request_share


def read_records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.open(encoding="utf-8")]


def exec_cmd(log: Path, *args: str, level: str = "detailed") -> list[str]:
    return [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log)] + [
        "--level",
        level,
        *args,
    ]


def exec_run(cmd: list[str], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """``cmd`` (an ``exec_cmd``) run to its end, which must be a success; its log's records."""
    r = subprocess.run(
        cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return read_records(Path(cmd[cmd.index("-o") + 1]))


@pytest.fixture(scope="module")
def server_run(
    tools_bin: Path, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    import openai

    log = tmp_path_factory.mktemp("server") / "server.log"
    port = free_port()
    proc = subprocess.Popen(
        exec_cmd(log, "llama-server", "-m", str(smollm2_path))
        + ["--host", "127.0.0.1", "--port", str(port), "--parallel", "2", "-c", "2048"]
        + ["-t", "2", "--no-webui"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(port, proc, timeout=180, path="/health")
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120
        )

        def completion(i: int) -> dict[str, Any]:
            r = client.completions.create(
                model="smollm2", prompt=f"Count from {i} to ten:", max_tokens=8, temperature=0
            )
            assert r.usage is not None
            return {
                "text": r.choices[0].text,
                "stream": False,
                "completion_tokens": r.usage.completion_tokens,
                "prompt_tokens": r.usage.prompt_tokens,
            }

        def chat_stream(i: int) -> dict[str, Any]:
            stream = client.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": f"Name {i} colors."}],
                max_tokens=8,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            text, usage = "", None
            for c in stream:
                if c.choices:
                    text += c.choices[0].delta.content or ""
                if c.usage is not None:
                    usage = c.usage
            assert usage is not None
            return {
                "text": text,
                "stream": True,
                "completion_tokens": usage.completion_tokens,
                "prompt_tokens": usage.prompt_tokens,
            }

        calls = [(completion, 1), (chat_stream, 2), (completion, 3), (completion, 4)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda f_i: f_i[0](f_i[1]), calls))
        signal_server(proc)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return {"results": results, "records": read_records(log), "log": log, "rc": proc.returncode,
            "err": err}  # fmt: skip


def test_server_ends_interrupted_on_sigint_with_a_valid_log(
    server_run: dict[str, Any], schema_validator: Any, tmp_path: Path
) -> None:
    recs = server_run["records"]
    for rec in recs:
        schema_validator.validate(rec)
    # llama-server's own Ctrl-C handling still ran: it shut down cleanly, as stock
    assert server_run["rc"] == 0, server_run["err"][-2000:]
    start, end = recs[0], recs[-1]
    assert start["type"] == "session_start" and start["metadata"]["program"] == "llama-server"
    assert "--parallel" in start["metadata"]["argv"]
    assert start["context"]["n_seq_max"] == 2
    assert end["type"] == "session_end" and end["status"] == "interrupted"
    assert end["totals"]["records"] == len(recs)
    converts_cleanly(server_run["log"], tmp_path / "server.pftrace")


def test_each_request_has_its_record_and_steps(server_run: dict[str, Any]) -> None:
    recs = server_run["records"]
    results = server_run["results"]
    assert all(r["text"] for r in results), results
    reqs = [r for r in recs if r["type"] == "request"]
    assert len(reqs) == 4
    assert sorted(r["stream"] for r in reqs) == [False, False, False, True]
    assert sorted(r["endpoint"] for r in reqs) == sorted(
        ["/v1/completions"] * 3 + ["/v1/chat/completions"]
    )
    # what the server told each client, against what its record says
    assert sorted(r["gen_tokens"] + 1 for r in reqs) == sorted(
        x["completion_tokens"] for x in results
    )
    steps = [r for r in recs if r["type"] == "step_begin"]
    assert steps
    for r in reqs:
        assert r["slot"] in (0, 1)
        assert 0 <= r["wait"] <= r["ttft"] <= r["wait"] + r["model"] <= r["dur"]
        # while it held its slot: from its prompt until the slot let it go
        t0, t1 = r["t_arrive"] + r["wait"], r["t_arrive"] + r["wait"] + r["model"]
        # the tokens of its sequence in the steps that ran while it held its slot, counted here
        # from step_begin directly (a step without seqs holds sequence 0 only)
        mine = 0
        n_steps = 0
        for s in steps:
            if not t0 <= s["ts"] <= t1:
                continue
            rows = s.get("seqs") or [[0, s["n_tokens"], s["pos"][0], s["pos"][1]]]
            n = sum(row[1] for row in rows if row[0] == r["slot"])
            mine += n
            n_steps += n > 0
        assert mine == r["prompt_tokens"] + r["gen_tokens"], r
        assert n_steps >= 1 + r["gen_tokens"] and r["gen_tokens"] > 0
    # two slots: some batches carried both requests' tokens
    assert any(len(s.get("seqs") or []) == 2 for s in steps)


def test_request_share_of_shared_batches(server_run: dict[str, Any]) -> None:
    from llamacpp_instr import load_session

    frames = load_session(server_run["log"])
    shares = request_share.request_shares(frames)
    assert len(shares) == 4
    recs = {r["id"]: r for r in server_run["records"] if r["type"] == "request"}
    for sh in shares:
        r = recs[sh.id]
        assert sh.tokens == r["prompt_tokens"] + r["gen_tokens"]
        assert 0 < sh.share_ns <= sh.steps_ns
    # a shared batch's time is split between its requests, never counted twice
    assert any(sh.shared_steps > 0 for sh in shares)
    total = frames.steps["dur_ns"].sum()
    assert sum(sh.share_ns for sh in shares) <= total


def test_summary_shows_the_requests_and_their_share(
    server_run: dict[str, Any], tmp_path: Path
) -> None:
    r = CliRunner().invoke(main, ["summary", str(server_run["log"]), "--format", "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["requests"]["requests"] == 4
    assert len(data["request_share"]) == 4


def test_cli_one_shot_prompt(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path, schema_validator: Any
) -> None:
    log = tmp_path / "cli.log"
    recs = exec_run(
        exec_cmd(log, "llama-cli", "-m", str(smollm2_path))
        + ["-p", "The capital of France is", "-n", "8", "-st", "-t", "2", "--temp", "0"]
    )
    for rec in recs:
        schema_validator.validate(rec)
    assert recs[0]["metadata"]["program"] == "llama-cli"
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "ok"
    assert any(x["type"] == "step_begin" and x["kind"] == "gen" for x in recs)
    converts_cleanly(log, tmp_path / "cli.pftrace")


def test_exec_records_value_statistics_only_when_asked(
    tools_bin: Path, tiny_llama_f32: Path, tmp_path: Path
) -> None:
    """``instr exec --level verbose`` hands the program VERBOSE without value statistics, even
    with LLAMA_INSTR_VALUE_STATS=1 in its environment (the options are the session's), and with
    them under ``--value-stats``: one tensor_stats record per compute."""
    program = ["llama-cli", "-m", str(tiny_llama_f32), "-p", "Hi", "-n", "2", "-st", "-t", "2"]
    counts = {}
    for way in ("plain", "asked"):
        log = tmp_path / f"{way}.log"
        extra = ["--value-stats"] if way == "asked" else []
        env = dict(os.environ, LLAMA_INSTR_VALUE_STATS="1")
        recs = exec_run(exec_cmd(log, *extra, *program, level="verbose"), env)
        assert any(x["type"] == "topk" for x in recs)  # VERBOSE either way
        kinds = [x["type"] for x in recs]
        counts[way] = (kinds.count("tensor_stats"), kinds.count("compute"))
    assert counts["plain"][0] == 0 and counts["asked"][0] == counts["asked"][1] > 0, counts


def test_exec_logs_to_an_inherited_llama_instr_log_unless_o_says_otherwise(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    inherited, given = tmp_path / "inherited.log", tmp_path / "given.log"
    instr = [sys.executable, "-m", "llamacpp_instr.cli", "exec"]
    program = ["llama-cli", "-m", str(smollm2_path), "-p", "Hi", "-n", "2", "-st", "-t", "2"]
    env = {**os.environ, "LLAMA_INSTR_LOG": str(inherited)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [*instr, *args, *program],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r

    r = run()  # no -o: the variable already set says where
    assert f"session log {inherited} " in r.stderr
    recs = read_records(inherited)
    assert recs[0]["type"] == "session_start" and recs[-1]["status"] == "ok"
    size = inherited.stat().st_size
    r = run("-o", str(given))  # -o wins, and says so
    assert f"-o {given} replaces LLAMA_INSTR_LOG={inherited}" in r.stderr
    assert read_records(given)[-1]["status"] == "ok"
    assert inherited.stat().st_size == size  # nothing more written there


def test_exec_passes_the_programs_own_offload_options_through(
    tools_bin: Path, tiny_llama_f32: Path, tmp_path: Path, schema_validator: Any
) -> None:
    """``instr exec`` hands llama-cli its own -ngl, --rpc and --device untouched: llama-cli
    registers the RPC server (a real one on loopback) and offloads the layers to it, and the log
    shows it."""
    from helpers.rpc_backend import rpc_server

    log = tmp_path / "cli-rpc.log"
    with rpc_server() as endpoint:
        own = ["-ngl", "99", "--rpc", endpoint, "--device", "RPC0"]
        r = subprocess.run(
            exec_cmd(log, "llama-cli", "-m", str(tiny_llama_f32), *own)
            + ["-p", "Hello", "-n", "4", "-st", "-t", "1", "--temp", "0"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert r.returncode == 0, r.stderr[-2000:]
    recs = read_records(log)
    for rec in recs:
        schema_validator.validate(rec)
    start = recs[0]
    argv = start["metadata"]["argv"]
    at = argv.index("-ngl")
    assert argv[at : at + len(own)] == own
    rpc = [i for i, d in enumerate(start["machine"]["devices"]) if d["backend"] == "RPC"]
    assert len(rpc) == 1 and start["machine"]["devices"][rpc[0]]["description"] == endpoint
    layers = [w for w in start["weights"] if w["layer"] is not None]
    assert layers and all(w["buffer"].endswith(f"[{endpoint}]") for w in layers)
    splits = {s[0] for x in recs if x["type"] == "compute" for s in x["splits"]}
    assert rpc[0] in splits


def test_bench_tests_are_labelled_parts(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path, schema_validator: Any
) -> None:
    log = tmp_path / "bench.log"
    r = subprocess.run(
        exec_cmd(log, "llama-bench", "-m", str(smollm2_path))
        + ["-p", "16", "-n", "4", "-r", "2", "-t", "2", "-o", "json"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    tests = json.loads(r.stdout)
    recs = read_records(log)
    for rec in recs:
        schema_validator.validate(rec)
    parts = [x for x in recs if x["type"] == "part"]
    assert [p["label"] for p in parts] == ["pp16", "tg4"]
    steps = [x for x in recs if x["type"] == "step_begin"]
    for p, t in zip(parts, tests, strict=True):
        # llama-bench's own measurement of each repetition, as it printed it
        assert p["samples_ns"] == t["samples_ns"] and p["program"] == "llama-bench"
        tagged = [s for s in steps if s.get("request") == p["label"]]
        assert tagged and all(p["t_start"] <= s["ts"] <= p["t_start"] + p["dur"] for s in tagged)
    # warm-up + 2 repetitions: pp16 decodes 16 tokens 3 times; tg4 one warm-up token, then 4 x 2
    pp = sum(s["n_tokens"] for s in steps if s.get("request") == "pp16")
    tg = sum(s["n_tokens"] for s in steps if s.get("request") == "tg4")
    assert (pp, tg) == (16 * 3, 1 + 4 * 2)
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "ok"
    converts_cleanly(log, tmp_path / "bench.pftrace")
    s = CliRunner().invoke(main, ["summary", str(log), "--format", "json"])
    assert s.exit_code == 0, s.output
    assert [p["label"] for p in json.loads(s.output)["parts"]] == ["pp16", "tg4"]


def test_exec_of_a_program_that_does_not_fit_says_why_and_exits_3(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    """llama-bench's second test asks for a KV cache the budget has no room for: its log records
    the failed allocation, llama-bench says only that it could not create a context, and instr
    exec ends with `instr run`'s line and exit status 3."""
    from llamacpp_instr.contract.units import fmt_bytes

    bench = ["llama-bench", "-m", str(smollm2_path), "-n", "0", "-r", "1", "-t", "2"]
    bench += ["--no-warmup", "-o", "jsonl"]

    def run(log: Path, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "llamacpp_instr.cli", "exec", "-o", str(log)]
        return subprocess.run(
            cmd + ["--level", "minimal", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )

    # the first test alone, with no budget: what it holds when its first step begins
    first = tmp_path / "first.log"
    r = run(first, *bench, "-p", "16")
    assert r.returncode == 0, r.stderr[-2000:]
    footprint = sum(b["bytes"] for b in live_buffers(read_records(first)).values())
    budget = footprint + (1 << 20)
    # both tests under a budget with room for the first: the second's 4096 cells do not fit
    log = tmp_path / "oom.log"
    r = run(log, "--memory-budget", f"CPU={budget}", *bench, "-p", "16,4096")
    assert r.returncode == 3, r.stderr[-2000:]
    kv = gguf_kv_bytes(smollm2_path, 4096)  # from the model's hyperparameters
    lines = r.stderr.strip().splitlines()
    assert "failed to create context" in "\n".join(lines[:-1])  # the program's own words first
    line = lines[-1]
    assert line.startswith(f"error: out of memory on CPU (budget {fmt_bytes(budget)}): "), line
    assert f"kv_cache needed {fmt_bytes(kv)}" in line and "short by" in line, line
    assert "-ctk q8_0 -ctv q8_0" in line, line
    # the line is made of the failure the log holds, and the log ends on a complete record
    recs = read_records(log)
    failed = [x for x in recs if x["type"] == "memory_alloc_failed"]
    assert len(failed) == 1 and failed[0]["bytes"] == kv and failed[0]["by_budget"] is True
    assert recs[-1]["type"] == "session_end" and log.read_bytes().endswith(b"\n")
    assert recs[-1]["status"] == "error"  # the program exited with a failure status
    tests = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert [t["n_prompt"] for t in tests] == [16]  # the first test ran and printed
    # the same budget for the test that fits: no line, the program's own status
    r = run(tmp_path / "fits.log", "--memory-budget", f"CPU={budget}", *bench, "-p", "16")
    assert r.returncode == 0 and "out of memory" not in r.stderr, r.stderr[-2000:]
    assert read_records(tmp_path / "fits.log")[-1]["status"] == "ok"


def test_exec_passes_a_failure_that_is_no_allocations_through(
    tools_bin: Path, tmp_path: Path
) -> None:
    """A program failing for another reason keeps its own exit status, with no line of instr's
    (even with an earlier failed allocation in the same log, which a run that went on since was
    not ended by)."""
    log = tmp_path / "bench.log"
    log.write_text(
        json.dumps({"type": "session_start", "ts": 1, "sid": "a", "schema_version": 1}) + "\n"
        + json.dumps({"type": "memory_alloc_failed", "ts": 2, "sid": "a", "device": 0,
                      "device_name": "CPU", "buffer_type": "CPU", "purpose": "kv_cache",
                      "bytes": 10, "free": 1, "total": 1, "by_budget": True, "budget": 1,
                      "held": {}}) + "\n"
    )  # fmt: skip
    r = subprocess.run(
        exec_cmd(log, "llama-bench", "-m", str(tmp_path / "missing.gguf"), "-p", "8", "-n", "0"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr[-2000:]
    assert "failed to load model" in r.stderr.splitlines()[-1]  # the program's own last word
    assert "out of memory" not in r.stderr


# a program that says which signals it gets (with os.write: a handler may run inside a print)
# and exits 7 on SIGTERM; with {alone}, it leaves instr's process group first. (Not bash, which
# may take a signal between two commands and act on it late, or not at all.)
SIGNALLED_PROGRAM = """
import os, signal
if {alone}:
    os.setpgid(0, 0)
def say(what):
    os.write(1, what.encode() + b"\\n")
signal.signal(signal.SIGINT, lambda *_: say("INT"))
signal.signal(signal.SIGHUP, lambda *_: say("HUP"))
signal.signal(signal.SIGTERM, lambda *_: (say("TERM"), os._exit(7)))
say("ready")
while True:
    signal.pause()
"""


EXEC_LIKE = """
import sys
from pathlib import Path
from llamacpp_instr.running import child
child.end_like(child.run(Path(sys.argv[1]), [sys.argv[1]], {"PATH": "/usr/bin:/bin"}))
"""


def read_until(fd: int, what: str, seen: str = "") -> str:
    """What ``fd`` gives until ``what`` is in it (at most 30 s; a failure says what came)."""
    import select

    deadline = time.monotonic() + 30
    while what not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            try:
                data = os.read(fd, 1024)
            except OSError:  # a terminal whose other side has closed
                break
            if not data:
                break
            seen += data.decode(errors="replace")
    assert what in seen, seen
    return seen


@pytest.mark.fast
def test_exec_passes_signals_on_once_and_ends_as_its_program_did(tmp_path: Path) -> None:
    """instr exec's child (llamacpp_instr.running.child): a signal sent to instr reaches the program once;
    Ctrl-C at the terminal is not passed on (the terminal sends it to the program itself); the
    program's exit status is instr's, and a program killed by a signal takes instr with it."""
    import pty

    script = tmp_path / "program"
    script.write_text(f"#!{sys.executable}" + SIGNALLED_PROGRAM.format(alone=False))
    script.chmod(0o755)
    instr = [sys.executable, "-c", EXEC_LIKE, str(script)]

    # signals sent to instr's pid: each once, then SIGTERM ends the program with its status 7
    proc = subprocess.Popen(instr, stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None
    out = proc.stdout.fileno()
    try:
        seen = read_until(out, "ready\n")
        for sig, name in ((signal.SIGINT, "INT"), (signal.SIGHUP, "HUP"), (signal.SIGTERM, "TERM")):
            proc.send_signal(sig)
            seen = read_until(out, f"{name}\n", seen)
        assert proc.wait(timeout=30) == 7
        assert seen.split() == ["ready", "INT", "HUP", "TERM"]
    finally:
        if proc.poll() is None:
            proc.kill()
    # Ctrl-C typed at a terminal goes to its foreground process group: to instr and, were it in
    # that group as it is after exec, to the program. instr does not pass it on (the program
    # would get two). Here the program has left for a group of its own: any SIGINT it gets is
    # one instr passed on
    script.write_text(f"#!{sys.executable}" + SIGNALLED_PROGRAM.format(alone=True))
    pid, fd = pty.fork()
    if pid == 0:  # the child: instr on the terminal pty.fork made
        os.execv(sys.executable, instr)
    try:
        seen = read_until(fd, "ready")
        os.write(fd, b"\x03")
        time.sleep(1)  # what instr would pass on comes at once
        os.kill(pid, signal.SIGTERM)
        seen = read_until(fd, "TERM", seen)
        assert "INT" not in seen, seen
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    finally:
        os.close(fd)
    # a program killed by a signal: instr ends killed by the same one
    script.write_text(
        f"#!{sys.executable}\nimport signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n"
        "print('ready', flush=True)\nsignal.pause()\n"
    )
    proc = subprocess.Popen(instr, stdout=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None
    try:
        read_until(proc.stdout.fileno(), "ready")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == -signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()


def test_unset_or_bad_values_run_uninstrumented(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    base = [str(tools_bin / "llama-bench"), "-m", str(smollm2_path), "-p", "0", "-n", "1"]
    base += ["-r", "1", "-t", "2", "--no-warmup"]
    cases: dict[str, dict[str, str]] = {
        "unset": {},
        "unwritable path": {"LLAMA_INSTR_LOG": str(tmp_path / "missing-dir" / "x.log")},
        "unknown level": {"LLAMA_INSTR_LOG": str(tmp_path / "x.log"), "LLAMA_INSTR_LEVEL": "loud"},
        "bad top-k": {"LLAMA_INSTR_LOG": str(tmp_path / "x.log"), "LLAMA_INSTR_TOPK": "0"},
    }
    for why, extra in cases.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_INSTR_")}
        r = subprocess.run(base, env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (why, r.stderr[-1000:])
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("llama-instr:")]
        if why == "unset":  # nothing changes
            assert lines == [], lines
        else:
            assert len(lines) == 1 and "running uninstrumented" in lines[0], (why, lines)
        assert not (tmp_path / "x.log").exists(), why


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def process_state(pid: int, log: Path) -> str:
    """A process that did not exit: each thread's state and kernel wait channel, and the log's last
    line."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (task / "wchan").read_text()
        except OSError:
            continue
        lines.append(f"thread {task.name}: {stat} {wchan}")
    tail = log.read_bytes().rstrip().rsplit(b"\n", 1)[-1][:300] if log.exists() else b"(no log)"
    return "still running after SIGINT: " + "; ".join(lines) + f"; log ends: {tail!r}"


def test_sigint_with_the_default_action_ends_the_session(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path, schema_validator: Any
) -> None:
    """llama-bench leaves SIGINT's default action: the session ends `interrupted`, then the signal
    kills the process as it would have without instrumentation."""
    log = tmp_path / "bench.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_INSTR_")}
    env["LLAMA_INSTR_LOG"] = str(log)
    proc = subprocess.Popen(
        [str(tools_bin / "llama-bench"), "-m", str(smollm2_path), "-p", "0", "-n", "4096"]
        + ["-r", "50", "-t", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # the default action, whatever this process inherited: a shell without job control starts
        # its background commands with SIGINT ignored, and an ignored SIGINT is left ignored (the
        # program would not have died of it either)
        preexec_fn=default_sigint,
    )
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            if log.exists() and b'"step_end"' in log.read_bytes():
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            # say where each thread waits, and how the log ends, before the process is killed
            raise AssertionError(process_state(proc.pid, log)) from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == -signal.SIGINT
    recs = read_records(log)
    for rec in recs:
        schema_validator.validate(rec)
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "interrupted"


def test_tools_lists_them_and_exec_refuses_others(tools_bin: Path, tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["doctor", "--tools"])
    assert r.exit_code == 0
    for program in ("llama-server", "llama-cli", "llama-bench", "llama-perplexity"):
        assert str(tools_bin / program) in r.output
    assert str(tools_bin / "llama-fit-params") in r.output
    bad = CliRunner().invoke(main, ["exec", "llama-nope"])
    assert bad.exit_code == 2 and "unknown program" in bad.output
    # llama.cpp's memory projection runs no model: instr fit runs it
    fit = CliRunner().invoke(main, ["exec", "llama-fit-params", "-m", "x.gguf"])
    assert fit.exit_code == 2 and "instr fit --compare-llama" in fit.output


PYTHON_APP = """
import sys
import llama_cpp
import llamacpp_instr
from llamacpp_instr.native.bindings import SessionError
llm = llama_cpp.Llama(sys.argv[1], n_ctx=256, verbose=False)
print(llm("The capital of France is", max_tokens=4, temperature=0)["choices"][0]["text"])
try:
    with llamacpp_instr.session(llm, sys.argv[2]):
        pass
except SessionError as exc:
    print("refused:", exc)
"""


def test_the_variable_in_a_python_process(
    instr_api: Any, smollm2_path: Path, tmp_path: Path, schema_validator: Any
) -> None:
    """Set in a Python process, the library logs the whole process from its first context, and
    llamacpp_instr.session() says why it cannot open another session."""
    log = tmp_path / "py.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_INSTR_")}
    env["LLAMA_INSTR_LOG"] = str(log)
    r = subprocess.run(
        [sys.executable, "-c", PYTHON_APP, str(smollm2_path), str(tmp_path / "other.log")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused:" in r.stdout and "LLAMA_INSTR_LOG" in r.stdout, r.stdout
    assert not (tmp_path / "other.log").exists()
    recs = read_records(log)
    for rec in recs:
        schema_validator.validate(rec)
    meta = recs[0]["metadata"]
    assert meta["program"] == Path(meta["argv"][0]).name and "-c" in meta["argv"]
    assert recs[-1]["type"] == "session_end" and recs[-1]["status"] == "ok"
    assert sum(x["type"] == "step_begin" for x in recs) >= 4


def test_perfetto_request_slices_carry_their_share(
    server_run: dict[str, Any], tmp_path: Path
) -> None:
    from llamacpp_instr.converters.formats.convert import convert

    out = tmp_path / "server.json"
    convert(server_run["log"], out, fmt="json")
    events = json.loads(out.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    reqs = [
        e for e in events if e.get("cat") == "request" and "batch_share_ms" in e.get("args", {})
    ]
    assert len(reqs) == 4
    shares = {s.id: s for s in request_share.request_shares(_frames(server_run["log"]))}
    for e in reqs:
        sh = shares[e["args"]["id"]]
        assert e["args"]["steps"] == sh.steps and e["args"]["shared_steps"] == sh.shared_steps
        assert abs(e["args"]["batch_share_ms"] - sh.share_ns / 1e6) < 1e-3


def _frames(log: Path) -> Any:
    from llamacpp_instr import load_session

    return load_session(log)
