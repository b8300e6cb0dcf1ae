"""Two measures beside ``instr fit``'s projection: llama.cpp's own (``llama-fit-params
--fit-print``) and a real run's (``measured_run``: two tokens at the setting, its live buffers when
its last step ended), each under a memory budget of what the projection said each device holds.

The real run is a process of its own, the interpreter running ``child`` (``RUN``) on a pickled
``RunConfig``: the memory budget is the library's from its load (``LLAMA_INSTR_MEMORY_BUDGET``),
the run's live buffers are its own alone (none of the models this process loaded without weights),
and a setting that does not fit in truth ends that process, not this one. It calls ``runner``, not
the command line.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from llamacpp_instr.contract.errors import UserError
from llamacpp_instr.running import context_choices, offload
from llamacpp_instr.running import memory_budget as memory
from llamacpp_instr.running.footprint import BREAKDOWN_PURPOSES, Footprint
from llamacpp_instr.running.run_config import MediaInputs, RunConfig, resolve_threads

# the measuring run's process: ``child`` with the pickled RunConfig on its stdin
RUN = "from llamacpp_instr.running.footprint_checks import child\nchild()\n"


def fit_params_program(required: bool) -> Path | None:
    """llama-fit-params of the current patches: required with --compare-llama (a one-line error
    naming the build command if missing), else used when it is built."""
    from llamacpp_instr.native import tools

    try:
        return tools.find("llama-fit-params")
    except UserError:
        if required:
            raise
        return None


def _budget_env(budget: dict[str, int]) -> dict[str, str]:
    env = {**os.environ, memory.ENV_VAR: memory.format_budget(budget)}
    env.pop("LLAMA_INSTR_LOG", None)  # (a session of its own, not one the environment opens)
    return env


def llama_fit_params(exe: Path, cfg: RunConfig, budget: dict[str, int]) -> dict[str, Any]:
    """llama-fit-params --fit-print at ``cfg``'s setting, under a memory budget of ``budget``:
    {device: {"weights", "kv_cache", "compute": MiB}} (its own rounding down to MiB; its host
    row is the CPU's)."""
    n_batch = min(cfg.n_ctx, cfg.n_batch)
    cmd = [
        str(exe), "-m", str(cfg.model), "-c", str(cfg.n_ctx), "-ngl", str(cfg.offload.gpu_layers),
        "-b", str(n_batch), "-ub", str(min(n_batch, cfg.n_ubatch or cfg.n_batch)),
        "-fa", context_choices.flash_attn_name(cfg.flash_attn), "-ctk", cfg.type_k,
        "-ctv", cfg.type_v, "-t", str(resolve_threads(cfg.threads)), "--fit-print", "on",
    ]  # fmt: skip
    cmd += offload_args(cfg.offload, split_flag="-ts")
    r = subprocess.run(cmd, capture_output=True, text=True, env=_budget_env(budget), timeout=300)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"llama-fit-params failed ({r.returncode}): {tail}")
    out: dict[str, Any] = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            dev = "CPU" if parts[0] == "Host" else parts[0]
            out[dev] = dict(zip(BREAKDOWN_PURPOSES, (int(p) for p in parts[1:]), strict=True))
    if not out:
        raise UserError("llama-fit-params printed no projection")
    return out


def offload_args(o: offload.Offload, split_flag: str) -> list[str]:
    """--device, --rpc, the tensor split and --no-repack as a command line (llama.cpp's)."""
    args = [] if o.repack else ["--no-repack"]
    if o.devices is not None:
        args += ["--device", ",".join(o.devices) or "none"]
    if o.rpc:
        args += ["--rpc", ",".join(o.rpc)]
    if o.tensor_split is not None:
        args += [split_flag, ",".join(f"{x:g}" for x in o.tensor_split)]
    return args


def live_at_last_step(log: Path) -> Footprint:
    """A session log's live buffers (memory_alloc less memory_free) when its last step ended:
    {device: {purpose: bytes}}, each device by the name the run's own session_start gives it (the
    run's --rpc servers are devices of its process, not of this one)."""
    live: dict[int, dict[str, Any]] = {}
    at_step: dict[int, dict[str, Any]] = {}
    names: dict[int, str] = {}
    with log.open() as f:
        for line in f:
            r = json.loads(line)
            t = r.get("type")
            if t == "session_start":
                names = {d["index"]: d["name"] for d in r.get("machine", {}).get("devices", [])}
            elif t == "memory_alloc":
                live[r["id"]] = r
            elif t == "memory_free":
                live.pop(r["id"], None)
            elif t == "step_end":
                at_step = dict(live)
    out: Footprint = {}
    for r in at_step.values():
        if not r["bytes"]:
            continue
        dev = names.get(int(r["device"]), str(r["buffer_type"]))
        purpose = "kv_cache" if r["purpose"] == "recurrent" else r["purpose"]
        d = out.setdefault(dev, {})
        d[purpose] = d.get(purpose, 0) + int(r["bytes"])
    return out


def measured_run(cfg: RunConfig, budget: dict[str, int], media: MediaInputs) -> Footprint:
    """Run ``cfg``'s setting for real (its own process: module doc), two tokens at the minimal
    level with ``media``'s projector loaded where there is one, placed as it says (its
    ``offload``), under a memory budget of ``budget``; the live buffers when its last step
    ended."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "measure.log"
        run = replace(
            cfg, prompt="Hello", n_predict=2, level="minimal", out=log,
            media=media,
        )  # fmt: skip
        r = subprocess.run(
            [sys.executable, "-c", RUN], input=pickle.dumps(run), capture_output=True,
            env=_budget_env(budget), timeout=600,
        )  # fmt: skip
        if r.returncode != 0:
            said = r.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
            raise UserError(f"the measuring run failed ({r.returncode}): {said[-1]}")
        return live_at_last_step(log)


def child() -> None:
    """The measuring run's process (``measured_run``): the RunConfig pickled on stdin, run; a
    UserError is one line on stderr and exit 2."""
    from llamacpp_instr.running import runner

    cfg = pickle.load(sys.stdin.buffer)
    try:
        runner.run(cfg)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_status", 2))
