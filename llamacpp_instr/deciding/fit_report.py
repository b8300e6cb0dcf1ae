"""``instr fit``'s answer (``fit.FitResult``) as a report: per quantization, the setting that fits
with its ``instr run`` options, and its footprint per device and purpose (instr fit's projection,
and llama-fit-params' and a real run's where asked), a projector's (--mmproj) among them."""

from __future__ import annotations

from llamacpp_instr.converters.reports.report import Column, Report, Section, Table
from llamacpp_instr.deciding.fit import Answer, FitResult, Footprint
from llamacpp_instr.running import context_choices

# a projector's purposes (memory_alloc's: contract.schema.MEMORY_PURPOSES)
WEIGHTS, COMPUTE = "encoder_weights", "encoder_compute"

# the purposes' columns, in this order (a projector's last); other purposes follow
PURPOSES = ("weights", "kv_cache", "compute", "output", WEIGHTS, COMPUTE)


def report(result: FitResult) -> Report:
    return Report(
        title="What fits each device's memory (instr fit)",
        sections=[section(a) for a in result.answers],
        data=result.to_json(),
    )


def section(a: Answer) -> Section:
    """One quantization's answer: the setting, then its footprint per device and purpose."""
    if a.setting is None:
        over = ", ".join(a.overflow)
        text = f"does not fit, not even --ctx 256 with a q8_0 KV cache ({over})"
    else:
        s = a.setting
        kv = f"{s.type_k} KV cache, flash attention {context_choices.flash_attn_name(s.flash_attn)}"
        layers = f", {s.n_gpu_layers} of {a.n_layer + 1} layers offloaded" if a.gpu else ""
        text = f"fits --ctx {s.n_ctx} (n_ctx_train {a.n_ctx_train}){layers}, {kv}\n"
        text += f"instr run {a.model} " + " ".join(s.run_args(a.gpu))
        text += f" --mmproj {a.mmproj}" if a.mmproj is not None else ""
        text += " --no-mmproj-offload" if a.mmproj is not None and not a.mmproj_offload else ""
    if a.mmproj is not None:
        text += "\n" + projector_line(a)
    found = sources(a)
    purposes = [p for p in PURPOSES if any(p in fp for _, _, fp in found)]
    purposes += sorted({p for _, _, fp in found for p in fp} - set(purposes))
    rows = [
        {
            "device": dev,
            "memory": a.memory.get(dev) if source == "instr fit" else None,
            "source": source,
            **{p: fp.get(p) for p in purposes},
            "total": sum(fp.values()),
        }
        for dev, source, fp in found
    ]
    table = Table(
        name="footprint",
        title="footprint per device and purpose (memory: what the device may hold)",
        columns=[
            Column("device", "device"),
            Column("memory", "memory", "bytes"),
            Column("source", "source"),
            *[Column(p, p, "mib") for p in purposes],
            Column("total", "total", "mib"),
        ],
        rows=rows,
        note=note(a),
        whole=True,
    )
    return Section(title=f"{a.model.name} ({a.quant})", text=text, tables=[table])


def projector_line(a: Answer) -> str:
    """Where the projector's encoder is and what it holds there (its share of the footprint)."""
    mib = 1 << 20
    held = [
        f"{dev}: weights {p.get(WEIGHTS, 0) / mib:.1f} MiB, compute {p.get(COMPUTE, 0) / mib:.1f} MiB"
        for dev, p in a.footprint.items()
        if WEIGHTS in p or COMPUTE in p
    ]
    return (
        f"with the projector {a.mmproj} (compute for its largest input, mtmd's warmup): "
        + "; ".join(held)
    )


def note(a: Answer) -> str:
    if not a.llama_fit:
        return ""
    if a.mmproj is None:
        return "llama-fit-params rounds each figure down to a MiB"
    return "llama-fit-params rounds each figure down to a MiB and takes no --mmproj"


def sources(a: Answer) -> list[tuple[str, str, dict[str, int]]]:
    """(device, source, {purpose: bytes}) in device order: instr fit's projection, then
    llama-fit-params' and the measured use where there are."""
    found: list[tuple[str, Footprint]] = [("instr fit", a.footprint)]
    if a.llama_fit is not None:
        in_bytes = {d: {p: v << 20 for p, v in fp.items()} for d, fp in a.llama_fit.items()}
        found.append(("llama-fit-params", in_bytes))
    if a.measured is not None:
        found.append(("measured", a.measured))
    devs = list(dict.fromkeys(d for _, fp in found for d in fp))
    return [(d, name, fp[d]) for d in devs for name, fp in found if d in fp]
