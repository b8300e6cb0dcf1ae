"""Quantization as work done on models: ``quantize`` (llama_model_quantize), ``evaluate``
(perplexity and KL divergence against a base, with ``stats``), ``layers`` (where the error enters,
layer by layer) and ``sweep`` (quantize, evaluate and time each type in one go)."""
