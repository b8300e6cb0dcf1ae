"""Draft models for speculative decoding, made from a llama GGUF (the bundled SmolLM2) with gguf-py.

A draft is the model's first ``n_layer`` layers: every key copied with ``llama.block_count`` set to
``n_layer``, the embeddings, the output norm and the output head kept, the later layers' tensors
left out. It has the target's vocabulary (llama-server checks that the two match), so it can draft
for it; it is cheap (a fifth of the target's layers for 6 of 30) and guesses poorly.

``cached_draft`` writes it once per source file and layer count into a folder (the tests' session
folder, or the bench's) and reuses it after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np


def _add(writer: gguf.GGUFWriter, name: str, t: Any) -> None:
    qtype = gguf.GGMLQuantizationType(t.tensor_type)
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        writer.add_tensor(name, np.asarray(t.data))
    else:
        writer.add_tensor(name, np.asarray(t.data), raw_dtype=qtype)


def write_draft_model(src: Path | str, dest: Path | str, n_layer: int) -> Path:
    """Write the first ``n_layer`` layers of the llama model ``src`` to ``dest``; returns ``dest``."""
    dest = Path(dest)
    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise ValueError(f"{src}: architecture {arch!r}, not llama")
    n_src = int(reader.fields["llama.block_count"].contents())
    if not 1 <= n_layer <= n_src:
        raise ValueError(f"n_layer {n_layer}: the model has {n_src} layers")
    writer = gguf.GGUFWriter(str(dest) + ".partial", arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = n_layer if key == "llama.block_count" else field.contents()
        if key == "general.name":
            value = f"{value} draft {n_layer}L"
        writer.add_key_value(key, value, vtype, sub)
    for t in reader.tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and int(parts[1]) >= n_layer:
            continue
        _add(writer, t.name, t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    Path(str(dest) + ".partial").rename(dest)
    return dest


def cached_draft(src: Path | str, folder: Path | str, n_layer: int) -> Path:
    """The draft of ``src``'s first ``n_layer`` layers in ``folder``, written on first use."""
    src = Path(src)
    dest = Path(folder) / f"{src.stem}-draft{n_layer}.gguf"
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_draft_model(src, dest, n_layer)
    return dest
