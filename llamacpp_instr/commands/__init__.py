"""One module per ``instr`` sub-command.

Each module defines ``command`` (a click command) and is named for it (``instr to-perfetto``:
``to_perfetto.py``), so adding a command means adding a file here: ``llamacpp_instr.cli`` imports
a module only when its command runs (or for the help). Modules import heavy dependencies
(llama_cpp, pandas, pyarrow) inside the command function, so ``instr --help`` stays fast and
converter commands work without llama_cpp installed.

The options several commands share are in modules of their own (``options``,
``offload_options``, ``always_on_options``, ``deprecated``), as is what they share on the way out
(``output``); those modules define no command.
"""
