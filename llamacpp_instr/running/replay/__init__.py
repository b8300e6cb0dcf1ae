"""``instr replay``: a server's recorded requests sent again, at their recorded times, to
llama-server under other settings (or to a server already running), each timed as a client sees
it and set against the recording.

``rerun`` runs a replay (``replay``), from the requests a log recorded (``plan``: which are sent,
when, with what body; ``media``: the images and sounds their bodies name, found again by hash) to
the client that sends them (``client``, on what the server answers: ``responses``) and the server
it starts for each setting (``server``). Its figures are ``converters.session.replay_figures``'."""
