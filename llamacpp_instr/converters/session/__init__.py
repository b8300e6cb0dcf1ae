"""The session model: a log's records folded into sessions and steps (``fold``), and the figures
defined on them once: FLOPs and bytes (``derive``), each device's share of a token
(``device_time``), the KV cache's writers and readers (``kv_flows``), the requests' shares of
shared batches (``requests``) and the roofs of the machine that made the log (``machine_peaks``).
"""
