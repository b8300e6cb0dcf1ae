"""Exporters: a session log's figures handed to operators' own tools while the log is written.

``prometheus`` serves them at /metrics (``instr metrics``), from the per-step and per-request
figures ``live_requests`` derives from the records that ``log_input`` reads (the one module here
that imports from ``llamacpp_instr.converters``).
"""
