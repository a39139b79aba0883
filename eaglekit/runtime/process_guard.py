"""Runs one engine command so that nothing it starts outlives eaglekit.

    python -I process_guard.py PARENT_PID GRACE_S -- COMMAND [ARG ...]

eaglekit starts this guard as the leader of a session of its own; the guard runs COMMAND in a process group of its
own, which vLLM's engine-core process (and anything else COMMAND starts) joins. The guard stops that whole group,
SIGTERM first and SIGKILL after GRACE_S, when any of these happens:

- COMMAND ends (normally or not) while processes it started are still running;
- the guard gets SIGTERM, SIGINT or SIGHUP (how eaglekit stops an engine); more signals during the stop change
  nothing, so a stop is never abandoned half-way;
- eaglekit is gone, whatever ended it (SIGKILL, the OOM killer): on Linux a parent-death signal says so at once,
  and the parent pid, checked every POLL_S, says so everywhere.

Its exit status is COMMAND's (128 + N when a signal N ended it). It imports only the standard library: it runs in
whichever Python has the engine, apart from any engine code that could replace its signal handlers.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.1
KILL_WAIT_S = 5.0  # after SIGKILL, how long the group may take to disappear
PR_SET_PDEATHSIG = 1  # prctl options, from <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

stop_requested: list[int] = []


def _prctl(option: int, value: int) -> None:
    """A Linux prctl; elsewhere nothing (the parent pid check still stops the group)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _request_stop(signum: int, frame) -> None:
    stop_requested.append(signum)


def _reap(job: int) -> int | None:
    """Collect every exited child (orphans of the group come to this process, a subreaper); COMMAND's wait status
    when it is among them."""
    status = None
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == job:
            status = wait_status


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(group: int, job: int, grace_s: float, status: int | None) -> int | None:
    """SIGTERM to the group, SIGKILL to what is left after `grace_s`; COMMAND's wait status if it was collected."""
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if not _group_alive(group):
            break
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            collected = _reap(job)
            status = status if collected is None else collected
            if not _group_alive(group):
                break
            time.sleep(POLL_S / 2)
    return status


def _exit_status(wait_status: int | None) -> int:
    if wait_status is None:
        return 128 + signal.SIGTERM
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _start(command: list[str]) -> int:
    """COMMAND in a new process group, with a parent-death signal of its own should this guard be killed."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # exec keeps an ignored signal ignored; Python ignores it
            _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            os.execvp(command[0], command)
        except BaseException as exc:  # the child never returns into the guard's own code
            os.write(2, f"cannot run {command[0]}: {exc}\n".encode(errors="replace"))
        finally:
            os._exit(127)
    try:
        os.setpgid(pid, pid)
    except OSError:  # the child already set it, or already ran exec
        pass
    return pid


def main(argv: list[str]) -> int:
    parent, grace_s, command = int(argv[0]), float(argv[1]), argv[3:]
    for signum in STOP_SIGNALS:
        signal.signal(signum, _request_stop)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != parent:  # eaglekit was gone before the signal above was armed
        return 128 + signal.SIGTERM
    job = _start(command)
    status = None
    while status is None and not stop_requested and os.getppid() == parent:
        status = _reap(job)
        if status is None:
            time.sleep(POLL_S)
    return _exit_status(_stop_group(job, job, grace_s, status))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
