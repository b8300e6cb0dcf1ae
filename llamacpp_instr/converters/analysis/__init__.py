"""Analysis: a session as pandas tables (``frames``, with ``frames_devices``; ``load_session``),
its ops against the machine's roofs (``roofline``), appended to a dataset across sessions
(``dataset``), and a log followed while it is written (``follow``)."""
