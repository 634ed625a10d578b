"""A session's weight on the CPU. With autogroup scheduling (`kernel.sched_autogroup_enabled=1`, the default
of most distributions) Linux shares the CPU between sessions first and between the processes of a session
second; each session's share follows the nice value of its autogroup, not of its processes. The graph puts
its engines (`stages/engine_session.py`) and its HAProxy (`ingress/gate/haproxy.py`) in sessions of their
own and sets their weight here."""

from __future__ import annotations

AUTOGROUP = "/proc/self/autogroup"


def set_nice(nice: int) -> None:
    """Sets the nice value of this process's autogroup, which every process of its session shares. Raises
    OSError where the kernel has no autogroups, or refuses (a value below the current one needs
    CAP_SYS_NICE)."""
    with open(AUTOGROUP, "w") as group:
        group.write(str(nice))
