"""Analysis: a session as pandas tables (``frames``, with ``frames_devices``; ``load_session``),
its ops against the machine's roofs (``roofline``), and a log followed while it is written
(``follow``)."""
