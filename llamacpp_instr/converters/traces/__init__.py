"""Traces: the session laid out as tracks, slices and counters (``layout``, with ``items`` and
``device_tracks``), which the trace formats of ``formats`` write."""
