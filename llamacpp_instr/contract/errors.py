"""The one exception type that means "bad input": the CLI prints it as a one-line error."""


class UserError(Exception):
    """A problem with the user's input (file, option, log) rather than a bug.

    The CLI prints ``error: <message>`` on one line and exits with status 2, never a traceback.
    """
