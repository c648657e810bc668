"""Who holds a node-cache row: process identities that survive pid reuse.

A lease or download row of :mod:`loader.cache` names its owner by :class:`Proc`: pid,
start time (from ``/proc/<pid>/stat``, so a reused pid does not look alive) and pid
namespace. :func:`is_alive` decides whether an owner still runs, :func:`boot_id`
tells rows of an earlier boot (all dead) from this boot's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HAS_PROC", "Proc", "boot_id", "current_process", "is_alive", "proc_stat"]


@dataclass(frozen=True)
class Proc:
    """A process identity that survives pid reuse: pid, start time, pid namespace."""

    pid: int
    start: int
    ns: int


HAS_PROC = os.path.exists("/proc/self/stat")


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a live process; None when absent."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[19])


def current_process() -> Proc:
    pid = os.getpid()
    if not HAS_PROC:
        return Proc(pid, 0, 0)
    stat = proc_stat(pid)
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return Proc(pid, stat[1] if stat else 0, ns)


def is_alive(owner: Proc, me: Proc) -> bool:
    if owner.ns != me.ns:
        # Another pid namespace (container): its pids mean nothing here, so never
        # reclaim its rows (a reboot does). docs/cache.md says to share a namespace.
        return True
    if owner.pid == me.pid:
        return owner.start == me.start
    if HAS_PROC:
        stat = proc_stat(owner.pid)
        # A zombie (killed, not yet reaped) holds nothing any more.
        return stat is not None and stat[0] not in ("Z", "X") and stat[1] == owner.start
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""
