"""Deciding the next run from logs: what fits (`fit`), how fast a setting would run
(`prediction/`), which settings to choose (`plan`, `moe_plan` for a mixture of experts'
placements), the machine's peaks (`peak_probe`) and the quantization studies (`quant_eval`,
`quant_sweep`, `quant_layers`, `quantize`)."""
