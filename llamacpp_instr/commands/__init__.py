"""One module per ``instr`` sub-command.

Each module defines ``command`` (a click command) and is named for it (``instr to-perfetto``:
``to_perfetto.py``), so adding a command means adding a file here: ``llamacpp_instr.cli`` imports
a module only when its command runs (or for the help). Modules import heavy dependencies
(llama_cpp, pandas, pyarrow) inside the command function, so ``instr --help`` stays fast and
converter commands work without llama_cpp installed.

The options several commands share, and what they share on the way out, are in
``llamacpp_instr.cli_shared``: this folder holds the commands only.
"""
