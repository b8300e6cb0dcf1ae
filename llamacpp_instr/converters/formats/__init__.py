"""Every output format a log is converted to, in one room:

* traces: Perfetto protobuf (``perfetto/``) and Chrome JSON (``chrome_json``, ``chrome_ops``),
  both drawn from ``traces.layout`` and written through ``convert.to_perfetto``;
* tables: Parquet, a dataset across sessions (``parquet``; ``instr export --dataset``);
* operators' formats, from a log as it is written: Prometheus (``prometheus``; ``instr
  follow --prometheus``) and OpenTelemetry (``otlp``; ``instr export --otlp``), both from the figures
  ``live_figures`` derives from the records ``reading.tail`` follows.

The human reports (text, markdown, HTML, CSV, JSON) are ``reports`` and its ``renderers``.
"""
