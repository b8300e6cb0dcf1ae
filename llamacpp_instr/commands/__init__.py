"""One module per ``instr`` sub-command.

Each module defines ``command`` (a click command). ``llamacpp_instr.cli`` discovers them, so adding a
command means adding a file here. Modules import heavy dependencies (llama_cpp, pandas, perfetto)
inside the command function, so ``instr --help`` stays fast and converter commands work without
llama_cpp installed.
"""
