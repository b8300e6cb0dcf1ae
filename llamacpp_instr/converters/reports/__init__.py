"""Reports: ``report.Report`` objects (facts, tables, charts) built from a session's tables by
``summary``, ``compare``, ``device_report``, ``roofline_report``, ``request_share`` and the
quantization reports (``quant/``), and rendered by the registry in ``renderers/`` as text,
markdown, csv, json or html."""
