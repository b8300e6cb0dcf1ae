"""What several ``instr`` sub-commands share, defined once, in modules that define no command.

The options, one meaning each everywhere (``options``, ``run_options``, ``offload_options``,
``tensor_options``, ``always_on_options``), old spellings of options kept for a release
(``deprecated``) and the way out (``output``: ``load_log``, ``check_output``, ``emit``). Beside
``cli.py`` rather than inside ``commands/``, so that ``commands/`` holds exactly the commands, one
module each.
"""
