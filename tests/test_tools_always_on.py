"""Always on (issue 29) in llama-server, under `instr exec`: a sampled, rotating log under
concurrent load from the real `openai` client (every file parses, begins with session_start and
converts; the series reads as one session with all its requests), every request recorded once
whatever became of it (ok, refused with its status, dropped mid-stream as cancelled), SIGHUP after
logrotate moved the log, and a full disk (a small tmpfs: the server answers every request, the
log stays whole lines, writing resumes after a rotation)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers.support import exec_server, fill, series, signal_server, whole_lines

pytestmark = pytest.mark.native

MAX_BYTES = 64 * 1024


def start_server(log: Path, model: Path, *instr_args: str) -> tuple[subprocess.Popen[str], int]:
    return exec_server(
        log,
        model,
        *["--parallel", "2", "-c", "2048", "-t", "2"],
        instr_args=instr_args,
        stdout=subprocess.PIPE,
    )


def program_pid(proc: subprocess.Popen[str]) -> int:
    """The pid of the program ``instr exec`` (``proc``) runs: its one child."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def stop_server(proc: subprocess.Popen[str]) -> str:
    signal_server(proc)
    _, err = proc.communicate(timeout=60)
    return err


def completion(client: Any, i: int, tokens: int = 8) -> str:
    client.completions.create(
        model="m", prompt=f"Count from {i} to twenty:", max_tokens=tokens, temperature=0
    )
    return "ok"


def stream(client: Any, i: int, drop: bool = False) -> str:
    s = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": f"Tell story number {i}."}],
        max_tokens=48 if drop else 8,
        temperature=0,
        stream=True,
    )
    got = 0
    for chunk in s:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
            if drop and got == 2:
                s.close()  # the client goes away mid-stream
                return "cancelled"
    return "ok"


def refused(client: Any) -> str:
    import openai

    with pytest.raises(openai.BadRequestError):
        # more tokens than a slot's context (2048 / 2): the server answers 400
        client.completions.create(model="m", prompt="word " * 1500, max_tokens=4)
    return "error"


def malformed(port: int) -> str:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=b'{"prompt": "unterminated',
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code >= 400
    return "error"


@pytest.fixture(scope="module")
def loaded(
    tools_bin: Path, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """llama-server sampled 1 step in 4 and rotated at 64K, 20 requests at concurrency 4 (streams,
    two dropped, one refused, one malformed), then logrotate (move the log, SIGHUP), 4 more,
    SIGINT."""
    import openai

    tmp = tmp_path_factory.mktemp("server-always")
    log = tmp / "server.log"
    proc, port = start_server(
        log, smollm2_path, "--sample", "4", "--max-bytes", "64K", "--keep", "100"
    )
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120, max_retries=0
        )
        jobs = [
            (
                (lambda i=i: completion(client, i))
                if i % 3 == 0
                else (lambda i=i: stream(client, i, drop=i in (4, 11)))
            )
            for i in range(18)
        ]
        jobs += [lambda: refused(client), lambda: malformed(port)]
        with ThreadPoolExecutor(4) as pool:
            seen = list(pool.map(lambda job: job(), jobs))
        # logrotate: move the log away, then SIGHUP; the server goes on into a new file
        moved = tmp / "server.log.moved"
        log.rename(moved)
        proc.send_signal(signal.SIGHUP)
        with ThreadPoolExecutor(4) as pool:
            seen += list(pool.map(lambda i: completion(client, 100 + i), range(4)))
        err = stop_server(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    # every file the session wrote (rotated, moved, after SIGHUP, rotated again), in the order
    # they began (their first record, read here with json)
    files = sorted(tmp.glob("server.log*"), key=lambda p: json.loads(p.open().readline())["ts"])
    return {
        "log": log,
        "moved": moved,
        "files": files,
        "seen": seen,
        "err": err,
        "rc": proc.returncode,
    }


def test_rotation_under_load_every_file_parses_begins_and_converts(
    loaded: dict[str, Any], schema_validator: Any, tmp_path: Path
) -> None:
    from llamacpp_instr.converters.formats.convert import convert

    assert loaded["rc"] == 0, loaded["err"]
    files = loaded["files"]
    assert len(files) >= 4, files  # several rotations, the move, the file after SIGHUP
    for f in files:
        recs = whole_lines(f)
        for r in recs:
            schema_validator.validate(r)
        assert recs[0]["type"] == "session_start"
        begun = [r["step"] for r in recs if r["type"] == "step_begin"]
        assert begun == [r["step"] for r in recs if r["type"] == "step_end"]
        alone = tmp_path / (f.name + ".alone")
        alone.write_bytes(f.read_bytes())
        stats, report = convert(alone, tmp_path / (f.name + ".pftrace"))
        assert report.skipped == [] and stats.steps == len(begun)
    # the moved file ended on a whole step, the new file continues the session: its last record
    # is one written between steps (a step's end, a request, a sampler chain freed with its request)
    assert whole_lines(loaded["moved"])[-1]["type"] in ("step_end", "request", "chain")
    after = whole_lines(loaded["log"])
    assert after[0]["file"]["index"] >= 1 and after[-1]["type"] == "session_end"
    assert after[-1]["status"] == "interrupted" and after[-1]["totals"]["lost"] == 0


def test_the_series_reads_as_one_session_with_all_its_requests(loaded: dict[str, Any]) -> None:
    from llamacpp_instr import load_session

    f = load_session(str(loaded["log"]) + "*")  # the rotated files and the moved one
    assert f.info.files == len(loaded["files"]) and f.info.first_file == 0 and f.info.ended
    assert f.steps["step"].tolist() == list(range(len(f.steps)))
    assert f.sampling().sample_steps == 4
    assert set(f.steps["level"].astype(str)) == {"detailed", "minimal"}
    assert (f.steps.loc[f.steps["step"] % 4 == 0, "level"].astype(str) == "detailed").all()
    # exactly one record per request the client made, with the outcome it saw
    seen = sorted(loaded["seen"])
    assert sorted(f.requests["outcome"].astype(str)) == seen
    assert len(f.requests) == 24 and len(set(f.requests["id"].astype(str))) == 24


def test_dropped_streams_are_cancelled_with_the_tokens_sent(loaded: dict[str, Any]) -> None:
    from llamacpp_instr import load_session

    r = load_session(str(loaded["log"]) + "*").requests
    cancelled = r[r["outcome"].astype(str) == "cancelled"]
    assert len(cancelled) == 2
    for _, c in cancelled.iterrows():
        assert c["stream"] and c["status"] == 200 and c["tokens_sent"] >= 2
        assert c["dur_ns"] > 0 and c["slot"] in (0, 1)
    ok = r[r["outcome"].astype(str) == "ok"]
    assert (ok["status"] == 200).all() and (ok["gen_tokens"] > 0).all()


def test_refused_and_malformed_requests_have_their_status(loaded: dict[str, Any]) -> None:
    recs = [
        x
        for f in loaded["files"]
        for x in whole_lines(f)
        if x["type"] == "request" and x["outcome"] == "error"
    ]
    assert len(recs) == 2
    by_id = {x["id"].split("-")[0]: x for x in recs}
    assert by_id["task"]["status"] == 400 and by_id["task"]["error"]
    # a slot took it, found it too long and gave it up: no token was sampled
    assert by_id["task"]["ttft"] is None and by_id["task"]["gen_tokens"] == 0
    assert by_id["failed"]["status"] >= 400 and by_id["failed"]["endpoint"] == "/v1/completions"


# --- a full disk --------------------------------------------------------------------------------


def recorded_after(log: Path, t: int) -> bool:
    """Does the log's series (as written so far: a rotation may have moved the record into
    LOG.1) hold a request that arrived after ``t`` (monotonic ns)?"""
    lines = []
    for f in series(log):
        try:
            lines += f.read_bytes().split(b"\n")[:-1]
        except OSError:
            continue
    return any(r.get("type") == "request" and r["t_arrive"] > t for r in map(json.loads, lines))


def test_a_full_disk_keeps_the_server_serving(
    tools_bin: Path, smollm2_path: Path, small_tmpfs: Path
) -> None:
    import openai

    log = small_tmpfs / "server.log"
    filler = small_tmpfs / "filler"
    # minimal: a step is well below --max-bytes (a detailed one of SmolLM2 writes ~200 KB of
    # graph table), so that files rotate while the disk is full without freeing it
    proc, port = start_server(
        log, smollm2_path, "--level", "minimal", "--max-bytes", "64K", "--keep", "8"
    )
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120, max_retries=0
        )
        answered = [completion(client, i) for i in range(2)]
        fill(filler)  # the disk fills up
        answered += [completion(client, i, tokens=16) for i in range(6)]
        filler.unlink()  # space is back: the next rotation resumes writing
        t_back = time.monotonic_ns()
        t_end = time.monotonic() + 300
        n = 0
        while not recorded_after(log, t_back) and time.monotonic() < t_end and n < 100:
            answered.append(completion(client, 50 + n, tokens=16))
            n += 1
        err = stop_server(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert answered == ["ok"] * len(answered) and proc.returncode == 0, err
    assert recorded_after(log, t_back), "writing did not resume"
    warnings = [ln for ln in err.splitlines() if ln.startswith("llama-instr: ")]
    # a line when writing stops, one when it resumes, and the session's end says what was lost
    assert len(warnings) == 3, err
    assert warnings[0].startswith(f"llama-instr: writing the log {log} failed: No space left")
    assert (
        " again (" in warnings[1] and "incomplete" in warnings[2] and "records lost" in warnings[2]
    )
    files = series(log)
    assert len(files) >= 2, files
    for f in files:
        recs = whole_lines(f)  # whole lines, whatever the disk did
        assert recs[0]["type"] == "session_start"
    last = whole_lines(files[-1])
    assert last[-1]["type"] == "session_end" and last[-1]["totals"]["lost"] > 0


def test_a_rotation_without_descriptors_loses_no_file(tools_bin: Path, smollm2_path: Path) -> None:
    """llama-server's open-file limit lowered with prlimit while its log is due to rotate, then
    restored (issue 35): the series stays as it was while no file can be opened, the server
    answers every request, and rotation resumes: LOG is back at its path, ending the session."""
    import tempfile

    import openai

    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        proc, port = start_server(
            log, smollm2_path, "--level", "minimal", "--max-bytes", "64K", "--keep", "50"
        )
        try:
            # one connection, kept alive: the server needs no new descriptor to answer
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=120, max_retries=0
            )
            answered = [completion(client, i, tokens=16) for i in range(4)]
            before = [f.name for f in series(log)]
            # the lowest descriptor number free in llama-server: an open would take it, so a limit
            # there fails it
            server = program_pid(proc)
            fds = {int(p.name) for p in Path(f"/proc/{server}/fd").iterdir()}
            n_fds = min(set(range(len(fds) + 1)) - fds)
            soft = subprocess.run(
                ["prlimit", f"--pid={server}", "--nofile", "--output=SOFT", "--noheadings"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            # the soft limit only: raising a lowered hard limit back takes a privilege
            subprocess.run(["prlimit", f"--pid={server}", f"--nofile={n_fds}:"], check=True)
            answered += [completion(client, 10 + i, tokens=16) for i in range(8)]
            during = [f.name for f in series(log)]
            subprocess.run(["prlimit", f"--pid={server}", f"--nofile={soft}:"], check=True)
            time.sleep(10.5)  # a failed rotation is tried again 10 s later
            answered += [completion(client, 30 + i, tokens=16) for i in range(8)]
            err = stop_server(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert answered == ["ok"] * len(answered) and proc.returncode == 0, err
        assert "server.log" in before and len(before) >= 2, before
        assert during == before, (before, during)
        warnings = [ln for ln in err.splitlines() if ln.startswith("llama-instr: ")]
        assert warnings and all("cannot rotate the log" in w for w in warnings), err
        files = series(log)
        assert len(files) > len(before) and files[-1].name == "server.log"
        indices = [whole_lines(f)[0].get("file", {}).get("index", 0) for f in files]
        assert indices == list(range(indices[0], indices[0] + len(files))), indices
        last = whole_lines(files[-1])
        assert last[-1]["type"] == "session_end" and last[-1]["totals"]["lost"] == 0


# --- SIGUSR1: the level switched in a live server -----------------------------------------------


def test_sigusr1_switches_the_level_between_steps(
    tools_bin: Path, smollm2_path: Path, tmp_path: Path
) -> None:
    """A server opened at detailed, told SIGUSR1 twice between three requests: the first
    request's steps and host records are detailed, the second's minimal, the third's detailed
    again, and the server says each switch in one line."""
    from helpers.support import post_completion

    log = tmp_path / "server.log"
    proc, port = start_server(log, smollm2_path)
    try:
        body = {"prompt": "Count to ten:", "n_predict": 4, "temperature": 0}
        post_completion(port, body)
        for _ in range(2):
            os.kill(program_pid(proc), signal.SIGUSR1)
            time.sleep(0.5)  # the watcher sets it at once; the signal's way there is not timed
            post_completion(port, body)
        err = stop_server(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    said = [line for line in err.splitlines() if "SIGUSR1" in line]
    assert [line.split()[-5] for line in said] == ["minimal", "detailed"], said
    recs = whole_lines(log)
    requests = sorted((r for r in recs if r["type"] == "request"), key=lambda r: r["t_arrive"])
    assert [r["level"] for r in requests] == ["detailed", "minimal", "detailed"], requests
    for r in requests:  # one at a time: a request's steps are those begun while it ran
        t0, t1 = r["t_arrive"], r["t_arrive"] + r["dur"]
        levels = {x["level"] for x in recs if x["type"] == "step_begin" and t0 <= x["ts"] <= t1}
        assert levels == {r["level"]}, (r["id"], levels)
    # the host's work between steps follows the steps' level: its samplers only when detailed
    hosts = [r for r in recs if r["type"] == "host"]
    assert {r["level"] for r in hosts} == {"detailed", "minimal"}
    assert all(("seqs" in r) == (r["level"] == "detailed") for r in hosts)
