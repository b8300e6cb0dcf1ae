"""Traces: the session laid out as tracks, slices and counters (``layout``, with ``items`` and
``devices``), written as Perfetto protobuf (``perfetto/``) or Chrome JSON (``chrome_json``) through
the writers' registry and ``to_perfetto`` (``convert``)."""
