"""The record decoder: what each record of a session log says, as typed objects and columns.

Every reader of logs goes through here (``session.fold.iter_events`` folds these into steps; the
trace writers, the tables of ``analysis.frames``, ``follow``, ``compare``, ``kv_flows`` read
those). One module per record family:

* ``fields``: the checks every decoder shares (``nonneg``, ``uint``...) and ``MALFORMED``, what a
  record that parses but lacks the schema's shape raises, with ``skip_malformed``;
* ``graphs``: ``Node`` and ``Graph`` (graph tables, ``graph_table``);
* ``columns``: the one packer of a compute's ``ops`` and ``layers`` lists into int64 columns
  (``pack_ops``, ``layer_rows``), which the forked reader (``reading.prefetch``) runs on the
  other core, and ``LayerSpan``; ``layer_plan``: where the values of layer rows of four and five
  (a device log's) lie in their flat list, made once per row widths;
* ``devices``: where a compute ran (``Placement``: splits, copies, busy, clocks, remote graphs);
* ``transfers``: the commands sent to RPC servers (``Transfers``);
* ``computes``: ``Compute`` (its ops always columns; ``unpack``/``op_at``, the lazy per-op view,
  ``OpTiming``, for the few places that want objects), ``decode_compute`` and, its ops in bulk,
  ``decode_compute_bulk``, ``attach_stats``;
* ``passes``: ``Pass``, what every kind of compute holds between its step_begin and its step_end
  (``begun``, ``end_step``);
* ``steps``: ``Step``, a decode step, and what step_begin and topk say of it (``step_seqs``,
  ``topk_rows``);
* ``sessions``: ``SessionInfo`` (session_start) and the events a fold yields.
"""
