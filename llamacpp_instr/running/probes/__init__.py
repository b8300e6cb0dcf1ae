"""Probes that time this machine for a prediction: attention at a depth no log ran (``kv_probe``)
and a generated token's matmuls at a thread count no log ran (``gemv_probe``)."""
