"""A step of a job's spawn chain (agent/sandbox.py): the rest of it in a Landlock domain of its own.

Run as ``python -I -S agent/landlock.py PROGRAM ARG...`` (root, just before ``setpriv``): it
creates a Landlock ruleset that handles no file-system or network access (nothing of the job's
files or ports changes) but has both scopes of Landlock ABI 6 (Linux 6.12), enters it, and
``execv``s ``PROGRAM`` (an absolute path) with its arguments. Everything the job runs inherits the
domain, and no process can leave one. So, from inside it,

- ``LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET``: a process cannot connect (or send a datagram) to an
  abstract unix socket (``"\\0name"``, no file behind it: neither file permissions nor mount
  namespaces nor the loopback rules reach it) made by a process outside its domain — another job's
  (NCCL's or torch's IPC sockets), a node service's (EPERM; the agent makes none). Sockets its own
  processes make are reachable as before, so a launcher and its workers in one replica keep talking;
- ``LANDLOCK_SCOPE_SIGNAL``: it cannot signal a process outside its domain (EPERM), even one of
  its own uid (another replica of its attempt on the node).

One domain per replica process (per attempt): another job, another attempt, another replica of
the same attempt are outside it. Processes outside a domain are not bound by it: the agent still
signals and stops the job.

``landlock_restrict_self`` needs ``no_new_privs`` or ``CAP_SYS_ADMIN``; the step sets
``no_new_privs`` itself (``setpriv --no-new-privs`` sets it for the job right after anyway), so it
works for a root agent in a container without ``CAP_SYS_ADMIN`` too. Any failure ends the spawn
(exit 125, saying why on stderr, in the job's log): a job never runs unscoped by accident where the
agent found Landlock at its start (:func:`agent.sandbox.scope_unavailable` runs this step once).

Plain Python through :mod:`ctypes` (util-linux's ``setpriv`` has no Landlock scopes; the Landlock
Python bindings are not packaged for Debian 12): stdlib only, no import of the agent or Django, run
with ``-I -S`` (no environment variables, no site-packages), as the chain runs as root here.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

# The kernel's generic syscall numbers: the same on x86_64 and aarch64 (and on every architecture
# for syscalls added since Linux 5.1, alpha apart).
LANDLOCK_CREATE_RULESET = 444
LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0  # flag: return the ABI version instead of a ruleset
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
LANDLOCK_SCOPE_SIGNAL = 1 << 1
SCOPES_ABI = 6  # the first ABI with ``scoped``
PR_SET_NO_NEW_PRIVS = 38
FAILED = 125  # as the chain's other steps that cannot set the job up (agent/sandbox.py)


class RulesetAttr(ctypes.Structure):
    """``struct landlock_ruleset_attr`` of ABI 6 (include/uapi/linux/landlock.h)."""

    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def abi(libc: ctypes.CDLL | None = None) -> int:
    """The kernel's Landlock ABI version; OSError saying why there is none."""
    libc = libc or _libc()
    version: int = libc.syscall(
        ctypes.c_long(LANDLOCK_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    if version < 0:
        code = ctypes.get_errno()
        if code == errno.ENOSYS:
            raise OSError(code, "this kernel has no Landlock (ENOSYS)")
        if code == errno.EOPNOTSUPP:
            raise OSError(
                code, "Landlock is disabled on this machine (EOPNOTSUPP: not in the lsm= boot parameter)"
            )
        raise OSError(code, f"landlock_create_ruleset: {os.strerror(code)}")
    return version


def restrict() -> int:
    """Put the calling process (single-threaded) in a new domain with both scopes and no access
    rights handled; returns the ABI version. OSError saying why not."""
    libc = _libc()
    version = abi(libc)
    if version < SCOPES_ABI:
        raise OSError(
            errno.EOPNOTSUPP, f"Landlock ABI {version} has no scopes (ABI {SCOPES_ABI}: Linux 6.12)"
        )
    attr = RulesetAttr(0, 0, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL)
    fd = _check(
        libc.syscall(
            ctypes.c_long(LANDLOCK_CREATE_RULESET),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
            ctypes.c_uint32(0),
        ),
        "landlock_create_ruleset",
    )
    try:
        zero = ctypes.c_ulong(0)
        _check(
            libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), zero, zero, zero), "prctl(PR_SET_NO_NEW_PRIVS)"
        )
        _check(
            libc.syscall(ctypes.c_long(LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)),
            "landlock_restrict_self",
        )
    finally:
        os.close(fd)
    return version


def main(argv: list[str]) -> None:
    if not argv or not os.path.isabs(argv[0]):
        print("usage: python -I -S landlock.py /ABSOLUTE/PROGRAM [ARG...]", file=sys.stderr)
        os._exit(2)
    try:
        restrict()
    except OSError as exc:
        print(
            f"tessera-agent: cannot put the job in a Landlock domain: {exc.strerror or exc}", file=sys.stderr
        )
        os._exit(FAILED)
    try:
        os.execv(argv[0], argv)
    except OSError as exc:
        print(f"tessera-agent: cannot run {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        os._exit(FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
