"""A seeded, bounded mutation fuzzer of the reading side (issue 55, section 3).

Each case is a committed fixture (among them a mixture of experts' VERBOSE log, with its
``experts`` records, llama-server speculating, with its ``context`` and ``spec`` records, and
llama-mtmd-cli's images and sound, with their ``media`` records and encodes) or
the hand-made server log of ``test_metrics``, the seeds taken in turn, with a few of its records
mutated: numbers pushed to extremes, values of another type, records cut short, graph tables and
substitutions forged, routing records grown past their graph or repeated, media and encodes
forged. Every reading command runs on it in this process (click's
``CliRunner``): each must end with exit 0, or exit 2 and one line ``error: ...``, never a
traceback. ``instr metrics`` is run as its loop runs the log (``RequestTracker`` into
``Metrics``, then a scrape), ``to-otlp`` against a local receiver when one is given.

Run alone: ``python tests/helpers/log_fuzz.py [SEED] [CASES]``.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from llamacpp_instr.cli import main

FIXTURES = Path(__file__).parent.parent / "fixtures"
LOGS = (
    "tiny-llama-detailed.log.gz",
    "tiny-llama-minimal.log.gz",
    "tiny-llama-rpc2-detailed.log.gz",
    "tiny-llama-verbose.log.gz",
    "tiny-llama-vulkan-partial-detailed.log.gz",
    "tiny-qwen2-detailed-ubatch.log.gz",
    "smollm2-moe4-verbose.log.gz",
    "seeds/smollm2-spec-minimal.log.gz",
    "tiny-llama-gemma3-images-detailed.log.gz",
    "seeds/tiny-llama-qwen2a-audio-detailed.log.gz",
)
SERVER = "the hand-made server log"
BODIES = "the hand-made server log, with bodies"  # what a replay reads: body, gen_ids
SEEDS = (*LOGS, SERVER, BODIES)
EXTREMES: list[Any] = [
    -1,
    -(2**63),
    2**62,
    2**63 - 1,
    2**63,
    2**64,
    2**64 + 7,
    10**30,
    0,
    1.5,
    -0.5,
    float("1e300"),
    True,
    None,
    "soon",
    "",
    [],
    {},
    [1] * 2000,
]
COMMANDS = (
    "summary",
    "to-perfetto",
    "export",
    "requests",
    "workloads",
    "predict",
    "compare",
    "experts",
)

Records = list[dict[str, Any]]


def fixture(name: str) -> Records:
    with gzip.open(FIXTURES / name) as f:
        return [json.loads(line) for line in f if line.strip()]


def server_log() -> Records:
    """A llama-server log made by hand: six requests on two slots (``test_metrics``)."""
    from test_metrics import one_request, session_start

    recs: Records = [session_start(0)]
    for i in range(6):
        r, _ = one_request(i, (i + 1) * 1_000_000, 4 * i)
        recs += r
    return recs


def server_log_with_bodies() -> Records:
    """The hand-made server log as llama-server records it at detailed: each request's body (a
    prompt, or a chat with an image as its marker), its size, its sampled tokens; one body left
    out for its size."""
    recs = server_log()
    for k, r in enumerate(x for x in recs if x["type"] == "request"):
        if k == 5:
            r |= {"body_left_out": "size", "body_bytes": 2 << 20}
            continue
        body: dict[str, Any] = {"prompt": f"request {k}", "n_predict": 3, "temperature": 0}
        if k % 2:
            marker = {"hash": f"{k:016x}", "bytes": 1000 + k, "prefix": "data:image/png;base64,"}
            part = {"type": "image_url", "image_url": {"url": {"instr_media": marker}}}
            body = {"messages": [{"role": "user", "content": [part]}], "stream": True}
            r["endpoint"] = "/v1/chat/completions"
        r |= {"body": body, "body_bytes": len(json.dumps(body)), "gen_ids": [k, k + 1, k + 2]}
    return recs


def _paths(v: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a record (keys and indices), lists of more than 64 items sampled."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield at + (k,)
            yield from _paths(x, at + (k,))
    elif isinstance(v, list):
        idx = range(len(v)) if len(v) <= 64 else [0, 1, len(v) // 2, len(v) - 1]
        for i in idx:
            yield at + (i,)
            yield from _paths(v[i], at + (i,))


def _set(rec: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        rec = rec[k]
    rec[path[-1]] = value


def _get(rec: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        rec = rec[k]
    return rec


def mutate_value(rnd: random.Random, recs: Records) -> None:
    """One value somewhere set to an extreme, or a number to a number near its own."""
    rec = rnd.choice(recs)
    paths = [p for p in _paths(rec) if p != ("type",)]
    if not paths:
        return
    path = rnd.choice(paths)
    old = _get(rec, path)
    if type(old) is int and rnd.random() < 0.3:
        _set(rec, path, old * rnd.choice([-1, 2**40, 0]) + rnd.choice([0, 1, -1]))
    else:
        _set(rec, path, copy.deepcopy(rnd.choice(EXTREMES)))


def drop_key(rnd: random.Random, recs: Records) -> None:
    rec = rnd.choice(recs)
    keys = [k for k in rec if k != "type"]
    if keys:
        del rec[rnd.choice(keys)]


def forge_tables(rnd: random.Random, recs: Records) -> None:
    """Graph records that name a table: one whose id is not written, ``subst`` of odd shapes, or
    many records of one ``subst`` each."""
    graphs = [r for r in recs if r["type"] == "graph"]
    if not graphs:
        return
    g = rnd.choice(graphs)
    at = recs.index(g) + 1
    head = {k: g[k] for k in ("type", "ts", "sid", "ctx", "n_tokens") if k in g}
    forged: Records = []
    for k in range(rnd.choice([1, 3, 50])):
        rec = head | {"graph": 10_000 + k, "same_as": rnd.choice([g.get("graph", 1), 999, -1])}
        choice = rnd.randrange(5)
        if choice == 0:
            rec["subst"] = [[rnd.randrange(6), rnd.choice([1, 2, 26, 256]), rnd.randrange(9)]]
        elif choice == 1:
            rec["subst"] = [[0, 1, 2]] * rnd.choice([2, 300])
        elif choice == 2:
            rec["subst"] = [[0, 26, 27]]
            rec["subst_at"] = [[rnd.choice([0, 5, 10**6]), rnd.choice([1, 2**63])]]
        elif choice == 3:
            rec["subst"] = rnd.choice([None, "x", [[0]], [[0, 1, 1]]])
        forged.append(rec)
    recs[at:at] = forged


def forge_routing(rnd: random.Random, recs: Records) -> None:
    """An ``experts`` record grown: rows repeated or pushed past its graph's routers (their
    layers, experts, ranked rows), its per-token ids multiplied, or the record repeated."""
    routed = [r for r in recs if r["type"] == "experts"]
    if not routed:
        return
    rec = rnd.choice(routed)
    choice = rnd.randrange(4)
    if choice == 0 and rec["rows"]:
        rec["rows"] = rec["rows"] * rnd.choice([2, 1000])
    elif choice == 1:
        big = rnd.choice([rec["n_layer"], rec["n_expert"], 2**31, 10**6])
        rec["rows"].append([rnd.randrange(4), rnd.randrange(8), 1, 0.5])
        rec["rows"][-1][rnd.randrange(3)] = big
    elif choice == 2 and rec.get("tokens"):
        blk = rnd.choice(rec["tokens"])
        blk[2], blk[3] = blk[2] * 50, blk[3] * 50
    else:
        recs.insert(recs.index(rec) + 1, copy.deepcopy(rec))


def forge_media(rnd: random.Random, recs: Records) -> None:
    """Images and sounds forged: ``media`` records repeated under other ids (or the same), an
    encode's medium slices grown or pushed to extremes, a decode step naming a medium no record
    describes, or an encode repeated as another step."""
    media = [r for r in recs if r["type"] == "media"]
    encodes = [r for r in recs if r["type"] == "step_begin" and r["kind"] == "encode"]
    if not media or not encodes:
        return
    choice = rnd.randrange(4)
    if choice == 0:
        rec = rnd.choice(media)
        at = recs.index(rec) + 1
        n = rnd.choice([1, 50, 2000])
        same = rnd.random() < 0.3
        recs[at:at] = [rec | {"id": rec["id"] if same else 1000 + k} for k in range(n)]
    elif choice == 1:
        rec = rnd.choice(encodes)
        pair = [rnd.choice([0, 1, 2**31, 2**62, -1]), rnd.choice([0, 1, 2**40])]
        rec["media"] = rec["media"] * rnd.choice([1, 64, 65]) + [pair]
    elif choice == 2:
        decodes = [r for r in recs if r["type"] == "step_begin" and r["kind"] != "encode"]
        rec = rnd.choice([d for d in decodes if "media" in d] or encodes)
        rec["media"] = [rnd.choice([999, 2**62, 0]), rnd.choice([0, 7])]
    else:
        rec = rnd.choice(encodes)
        group = [r for r in recs if r.get("step") == rec["step"] and r.get("ctx") == rec["ctx"]]
        last = recs.index(group[-1]) + 1
        copies = [copy.deepcopy(r) | {"step": 10_000 + rec["step"]} for r in group]
        recs[last:last] = copies


def forge_bodies(rnd: random.Random, recs: Records) -> None:
    """A request's body, its size or its tokens forged: a body of another type, deep, wide or
    large; markers of odd shapes; tokens of another type or 100,000 of them; a reason of 4 KiB."""
    reqs = [r for r in recs if r["type"] == "request"]
    if not reqs:
        return
    r = rnd.choice(reqs)
    choice = rnd.randrange(6)
    if choice == 0:
        r["body"] = rnd.choice(["{}", "x" * 5000, [1, 2], 7, None, {"prompt": ["x"] * 10_000}])
    elif choice == 1:
        deep: Any = {"prompt": "x"}
        for _ in range(rnd.choice([70, 500])):
            deep = {"messages": [deep]}
        r["body"] = deep
    elif choice == 2:
        odd = rnd.choice([{}, {"hash": 7}, {"hash": "zz", "bytes": -1}, "x", [None] * 100])
        r["body"] = {"messages": [{"content": [{"image_url": {"url": {"instr_media": odd}}}]}]}
    elif choice == 3:
        r["gen_ids"] = rnd.choice([[2**63] * 3, ["a"], list(range(100_000)), {}, -1])
    elif choice == 4:
        r["body_left_out"] = rnd.choice(["x" * 4096, 7, None, "size"])
        r.pop("body", None)
    else:
        r["body"] = {"prompt": "y" * rnd.choice([10, 2 << 20]), "stream": rnd.choice([1, "x"])}


def cut_record(rnd: random.Random, recs: Records) -> Records | None:
    """A line cut short (returned as raw text lines), or a record's list emptied."""
    rec = rnd.choice(recs)
    lists = [k for k, v in rec.items() if isinstance(v, list) and v]
    if lists and rnd.random() < 0.5:
        k = rnd.choice(lists)
        rec[k] = rec[k][: rnd.randrange(len(rec[k]))]
        return None
    return recs


MUTATIONS: list[Callable[[random.Random, Records], Any]] = [
    mutate_value,
    mutate_value,
    mutate_value,
    drop_key,
    forge_tables,
    forge_routing,
    forge_media,
    forge_bodies,
    cut_record,
]


def make_case(rnd: random.Random, out: Path, seed_log: str) -> Path:
    """``seed_log`` (one of ``SEEDS``) mutated, at ``out``."""
    if seed_log == SERVER:
        base = server_log()
    elif seed_log == BODIES:
        base = server_log_with_bodies()
    else:
        base = fixture(seed_log)
    cut_line = None
    for _ in range(rnd.choice([1, 2, 4])):
        m = rnd.choice(MUTATIONS)
        if m is cut_record and m(rnd, base) is not None:
            cut_line = rnd.randrange(len(base))
    lines = [json.dumps(r) for r in base]
    if cut_line is not None:
        line = lines[cut_line]
        lines[cut_line] = line[: rnd.randrange(1, max(2, len(line)))]
    out.write_text("\n".join(lines) + "\n")
    return out


def check_result(args: list[str], r: Any) -> str | None:
    """What is wrong with a command's result, or None: exit 0, or 2 with one line."""
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        return f"{args[0]}: {type(r.exception).__name__}: {r.exception}"
    if r.exit_code not in (0, 2):
        return f"{args[0]}: exit {r.exit_code}: {r.output[-300:]}"
    if r.exit_code == 2:
        # (a line saying what was skipped may come before it)
        err = r.stderr.strip().splitlines()
        if not err or not err[-1].startswith("error: ") or "Traceback" in r.stderr:
            return f"{args[0]}: exit 2 without an error line: {r.stderr[-300:]}"
    return None


def run_metrics(log: Path) -> str | None:
    """``instr metrics``' loop over the log, then a scrape: no exception."""
    from prometheus_client.exposition import generate_latest

    from llamacpp_instr.converters.formats.live_figures import RequestTracker
    from llamacpp_instr.converters.formats.prometheus import Metrics
    from llamacpp_instr.converters.reading.reader import BadLine, parse_line

    metrics, tracker = Metrics(), RequestTracker()
    try:
        for line in log.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                rec, _ = parse_line(line)
            except BadLine:
                continue
            metrics.observe(tracker.add(rec))
        generate_latest(metrics.registry)
    except Exception as exc:  # noqa: BLE001 - what the fuzzer reports
        return f"metrics: {type(exc).__name__}: {exc}"
    return None


def run_replay_plan(log: Path) -> str | None:
    """What ``instr replay`` reads of the log before it sends anything (the requests, their
    bodies, the plan of what goes out when): a plan, or one ``UserError``; nothing else."""
    from llamacpp_instr.contract.errors import UserError
    from llamacpp_instr.converters.session.replay_log import Selection, read_served
    from llamacpp_instr.running.replay.media import MediaFolder
    from llamacpp_instr.running.replay.plan import make_plan

    try:
        served = read_served(log, Selection())
        make_plan(str(log), served.requests, 1.0, MediaFolder(None))
    except UserError:
        pass
    except Exception as exc:  # noqa: BLE001 - what the fuzzer reports
        return f"replay plan: {type(exc).__name__}: {exc}"
    return None


def run_case(log: Path, work: Path, otlp_url: str | None) -> list[str]:
    """Every reading command on ``log``: what went wrong (empty: nothing)."""
    runner = CliRunner()
    problems = []
    for cmd in COMMANDS:
        args = [cmd, str(log)]
        if cmd == "to-perfetto":
            args += ["-o", str(work / "t.pftrace")]
        elif cmd == "export":
            args += ["--format", "csv", "-o", str(work / "export")]
        elif cmd == "workloads":
            args = ["export", str(log), "--workloads", "-o", str(work / "w.jsonl")]
        elif cmd == "compare":
            args += [str(FIXTURES / "tiny-llama-detailed.log.gz"), "--format", "json"]
        elif cmd in ("summary", "requests", "experts"):
            args += ["--format", "json"]
        bad = check_result(args, runner.invoke(main, args))
        if bad:
            problems.append(bad)
    if otlp_url is not None:
        args = ["export", str(log), "--otlp", otlp_url]
        r = runner.invoke(main, args)
        crashed = r.exception is not None and not isinstance(r.exception, SystemExit)
        # (exit 1: spans lost, said on one line)
        bad = check_result(args, r) if crashed or r.exit_code != 1 else None
        if bad:
            problems.append(bad)
    for bad in (run_metrics(log), run_replay_plan(log)):
        if bad:
            problems.append(bad)
    return problems


def fuzz(seed: int, cases: int, work: Path, otlp_url: str | None = None) -> list[str]:
    """``cases`` mutated logs from ``seed``, each of ``SEEDS`` in turn; each problem as ``case N:
    ...``."""
    rnd = random.Random(seed)
    out = []
    for n in range(cases):
        log = make_case(rnd, work / f"case{n}.log", SEEDS[n % len(SEEDS)])
        out += [f"case {n} ({log}): {p}" for p in run_case(log, work, otlp_url)]
    return out


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent.parent))
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    with tempfile.TemporaryDirectory() as d:
        found = fuzz(seed, n, Path(d))
    print("\n".join(found) or f"{n} cases, no problem")
    sys.exit(1 if found else 0)
