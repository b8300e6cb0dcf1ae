"""The Perfetto writer: the layout's items as a Perfetto trace, every packet encoded by hand, many
times faster than one protobuf object per packet (bench/convert.py; tests/test_perfetto_bulk_matches_reference.py
compares the two, packet by packet, with tests/reference/perfetto_writer.py).

* ``writer``: the ``Writer``, which gathers the layout's items into rows a step at a time
  (``batch``); ``flushes``: its finished batches encoded by the parts below and written, a few
  flushes deferred to encode their slice begins together;
* ``templates``: a compute seen again (so every generation step) written from the template of
  its previous packets, new timestamps and rates in place (``TemplateSet``; ``template``: one
  made; ``template_fill``: a flush's blocks filled from theirs; ``stacks``: the timestamps of
  every template of a flush gathered and checked at once);
* ``bulk``: anything else, sorted and encoded in bulk with numpy (``BulkEncoder``);
* ``singles``: the rows no template covers (steps, and a device log's splits, copies, command
  buffers, network commands) framed in bulk, and a flush's units put in key order;
  ``begins``: those slices' begins encoded by columns at the flush (``pieces`` assembles the
  bytes); ``segments``: a device log's ``SliceRows`` kept as columns through the flush;
  ``merge``: a flush with many single rows (a device log's: about one for every two ops) or
  single rows inside templated blocks: each single row placed among the blocks' rows, which
  are in key order already (``inserts.plan``), and the packets joined in runs from the
  templates' buffers and the framed single rows; where blocks interleave, every row's key
  sorted in one pass (``keysort``);
* ``ops``: what does not depend on timing, encoded once per graph node (and fused variant) and
  track (``NodeTables``, ``OpStore``), and the rates that do (``RateFields``);
* ``events``: the fields of slices and counters; ``packets``: framing, track descriptors,
  interning and the sequence's state, compressed bundles; ``protowire``: tags and varints.

Big traces (from ``writer.AUTO_COMPRESS`` bytes on) are written as zlib-compressed bundles
(``TracePacket.compressed_packets``, as Perfetto's tracing service writes them with compression
on) by ``sinks.BundleSink``, deflated by ISA-L or zlib on worker threads while the next packets
are encoded. Smaller traces stay plain packets with inline strings, which any protobuf reader
can parse. Each track descriptor comes where the layout yields its track; the events of each step
(a step slice and what follows it up to the next) come in the order of their keys: timestamp,
rank (ends, then begins, then counter samples and the ends of zero-length slices), depth (outer
slices begin first and end last), then the order the layout made them in (``batch``).
"""

from .writer import write_perfetto_fast

__all__ = ["write_perfetto_fast"]
