"""Quantization reports: the weights of a GGUF file or a log per tensor, layer, role and type
(``inventory``, rendered by ``render``), and the reports of ``instr quant-eval``
(``eval_report``, ``layers_report``) and ``instr quant-sweep`` (``sweep_report``)."""
