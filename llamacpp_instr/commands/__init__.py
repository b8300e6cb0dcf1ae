"""One module per ``instr`` sub-command.

Each module defines ``command`` (a click command). ``llamacpp_instr.cli`` discovers them, so adding a
command means adding a file here. Modules import heavy dependencies (llama_cpp, pandas, perfetto)
inside the command function, so ``instr --help`` stays fast and converter commands work without
llama_cpp installed.
"""

import click

# shared by every command that reads a log which may hold several sessions
session_option = click.option(
    "--session", "sid", default=None, help="Session id, when the log holds several."
)
