"""A program run as this process's only job, as if it had replaced it (``instr exec``), so that
this process can still speak once the program has ended (an out-of-memory line, exit status 3).

The program is this process's child, in the same process group and session: it keeps the
terminal (its input, its colours, Ctrl-C and Ctrl-Z) as it would have had after exec. While it
runs, this process blocks the signals a user or a supervisor sends it and takes them itself:

- a signal sent by a process (``kill``, a test's ``send_signal``, a supervisor that signals the
  pid it started) is passed on to the program, once, and the program handles it as it always does
  (llama-server shuts down on SIGINT/SIGTERM, and reopens its log on SIGHUP);
- a signal the kernel sent (Ctrl-C or Ctrl-\\ at the terminal, a hangup) went to the whole
  foreground process group, the program included: passing it on would make a second Ctrl-C,
  which llama-server takes as "terminate immediately".

A signal sent with ``kill`` to the whole process group reaches the program twice (once from the
sender, once passed on), which exec never did; signal the pid, or the program, instead.

Blocking covers this thread only: numpy's OpenBLAS (imported with the converters) has threads of
its own, which take a signal sent while this one is not waiting for it (it waits all the time but
for the moments it acts on one). Handlers catch those, so that none ends this process or is lost;
they cannot tell the terminal's signals from a process's, and take a SIGINT, SIGQUIT or SIGHUP
for the terminal's while this process is in its terminal's foreground (so not passed on). The
program's end is also looked for every second, in case such a thread took its SIGCHLD.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)

# si_code of a signal the kernel generated (the terminal's line discipline, a hangup); a process's
# kill() is SI_USER (0), sigqueue SI_QUEUE (-1), tgkill SI_TKILL (-6)
_SI_KERNEL = 0x80

# the signals Python ignores for itself, which a program expects at their default (as subprocess
# restores them): a llama-bench piped into `head` ends on SIGPIPE as it does when run directly
_RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)

# the signals a terminal sends its foreground process group
_TERMINAL = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)

# how often the program's end is looked for without a SIGCHLD
_POLL_S = 1.0


def _terminal_foreground() -> bool:
    """Whether this process's group is its controlling terminal's foreground group (the group
    Ctrl-C signals)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False  # no controlling terminal
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def run(exe: Path, argv: Sequence[str], env: dict[str, str]) -> int:
    """Run ``exe`` with ``argv`` and ``env`` until it ends, passing on the signals sent to this
    process; its exit status, or minus the signal that ended it (as ``Popen.returncode``)."""
    pid = 0

    def pass_on(signum: int) -> None:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def caught(signum: int, frame: object) -> None:
        # taken by another thread: where it came from is not known
        if signum != signal.SIGCHLD and not (signum in _TERMINAL and _terminal_foreground()):
            pass_on(signum)

    watched = {*FORWARDED, signal.SIGCHLD}
    # an ignored signal stays ignored, and is inherited so, as after exec
    handled = [s for s in watched if signal.getsignal(s) != signal.SIG_IGN]
    handlers = {s: signal.signal(s, caught) for s in handled}
    # blocked before the program exists, so that none is lost meanwhile
    before = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        pid = os.posix_spawn(str(exe), list(argv), env, setsigmask=before, setsigdef=_RESTORED)
        while True:
            info = signal.sigtimedwait(watched, _POLL_S)
            if info is not None and info.si_signo != signal.SIGCHLD:
                if info.si_code != _SI_KERNEL:
                    pass_on(info.si_signo)
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return os.waitstatus_to_exitcode(status)
    finally:
        # a Ctrl-C the program got too, still pending here, is not this process's to act on
        while signal.sigtimedwait(watched, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        for s, handler in handlers.items():
            signal.signal(s, handler)


def end_like(returncode: int) -> NoReturn:
    """End this process as the program ended: with its exit status, or killed by the same signal
    (the shell then says so, and a caller sees 130 after Ctrl-C, as it would have after exec)."""
    if returncode >= 0:
        sys.exit(returncode)
    sig = -returncode
    sys.stdout.flush()
    sys.stderr.flush()
    # the program dumped its core, if it did; this process has none worth writing
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    sys.exit(128 + sig)  # a signal whose default action does not end a process
