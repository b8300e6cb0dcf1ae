"""The log's contract, below every other room: what every part of the package may import.

``schema`` (schema versions, record types, levels, memory purposes; ``schema_vN.json`` is the same
contract as JSON Schema, for readers outside Python), ``errors`` (``UserError``: the one exception
that means bad input, printed as one line), ``version`` (the package's version, which the logs
and exporters name) and ``units`` (how a number of bytes reads, everywhere).
"""
