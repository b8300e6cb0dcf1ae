"""instr fit --mmproj --no-mmproj-offload, on a stand-in machine: the answer remembers the
projector's placement, the measuring run (--measure) is handed it with the projector, and the
report's instr run line gives it back as --no-mmproj-offload. The real build's side (the measured
run places the projector where the plan counted it) is test_fit_mmproj's."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llamacpp_instr.deciding import fit_report
from llamacpp_instr.deciding.fit import Answer, FitRequest, Setting, fit
from llamacpp_instr.running.offload import Offload
from llamacpp_instr.running.run_config import MediaInputs, RunConfig
from llamacpp_instr.running.tensor_overrides import TensorOverrides

pytestmark = pytest.mark.fast

MIB = 1 << 20


class StandInMeter:
    """A model of 4 layers, a 1024-token training context, 1 MiB a 256 cells of KV cache."""

    n_layer, n_ctx_train = 4, 1024

    def footprint(self, cfg: RunConfig) -> dict[str, dict[str, int]]:
        return {"CPU": {"weights": 10 * MIB, "kv_cache": cfg.n_ctx // 256 * MIB}}

    def unlisted(self, cfg: RunConfig) -> dict[str, dict[str, int]]:
        return {}

    def close(self) -> None:
        pass


@dataclass
class StandInProjector:
    path: Path
    offload: bool

    def footprint(self, flash_attn: bool | None) -> dict[str, dict[str, int]]:
        return {"CPU": {"encoder_weights": 2 * MIB, "encoder_compute": MIB}}


@dataclass
class StandInMachine:
    """A CPU alone with 100 MiB free; what the measuring run was handed, in ``measured``."""

    measured: list[tuple[RunConfig, dict[str, int], MediaInputs]] = field(default_factory=list)

    def load(self, quiet: bool = False) -> None:
        pass

    def devices(self, rpc: tuple[str, ...]) -> list[str]:
        return ["CPU"]

    def free_memory(self) -> dict[str, int]:
        return {"CPU": 100 * MIB}

    def offload_devices(self, placed: Offload) -> list[str]:
        return []

    def meter(
        self, path: Path, placed: Offload, tensors: TensorOverrides | None = None
    ) -> StandInMeter:
        return StandInMeter()

    def quantized(
        self, path: Path, quants: tuple[str, ...], say: Callable[[str], None]
    ) -> list[tuple[str, Path]]:
        return [("f32", path)]

    def projector(
        self, path: Path, offload: bool, device_names: tuple[str, ...] | None
    ) -> StandInProjector:
        return StandInProjector(path, offload)

    def fit_params_program(self, required: bool) -> Path | None:
        return None

    def measured_run(
        self, cfg: RunConfig, budget: dict[str, int], media: MediaInputs
    ) -> dict[str, dict[str, int]]:
        self.measured.append((cfg, budget, media))
        return {"CPU": {"weights": 10 * MIB}}


@pytest.mark.parametrize("offload", [True, False], ids=["offloaded", "no-mmproj-offload"])
def test_the_measuring_run_is_handed_the_projectors_placement(
    tmp_path: Path, offload: bool
) -> None:
    """--measure runs with and without --no-mmproj-offload, and the measuring run gets the
    projector with the placement the plan counted it at."""
    model, mmproj = tmp_path / "model.gguf", tmp_path / "mmproj.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    machine = StandInMachine()
    request = FitRequest(model=model, measure=True, mmproj=mmproj, mmproj_offload=offload)
    result = fit(request, machine)  # type: ignore[arg-type]
    (answer,) = result.answers
    assert answer.setting is not None and answer.setting.n_ctx == 1024
    ((cfg, budget, media),) = machine.measured
    assert media == MediaInputs(mmproj=mmproj, offload=offload)
    assert cfg.n_ctx == 1024 and budget == {"CPU": 100 * MIB}
    assert answer.to_json()["mmproj_offload"] is offload


def report_text(**answer: Any) -> str:
    a = Answer(Path("m.gguf"), "f32", {"CPU": 100 * MIB}, 1024, 4, False, **answer)
    a.setting = Setting(1024, 0)
    a.footprint = {"CPU": {"weights": MIB, "encoder_weights": MIB}}
    return fit_report.section(a).text


def test_the_run_line_keeps_the_projector_on_the_cpu_as_planned() -> None:
    """The instr run line names --no-mmproj-offload where the projector was counted on the CPU
    by it, and only there."""
    kept = report_text(mmproj=Path("p.gguf"), mmproj_offload=False)
    assert "instr run m.gguf --ctx 1024 --mmproj p.gguf --no-mmproj-offload\n" in kept
    offloaded = report_text(mmproj=Path("p.gguf"))
    assert "instr run m.gguf --ctx 1024 --mmproj p.gguf\n" in offloaded
    assert "--no-mmproj-offload" not in offloaded + report_text()
