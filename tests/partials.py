"""Finding a writer's unnamed output: zt builds a file with O_TMPFILE
(no name until it is complete), which /proc lists among the writer's
descriptors as `DIR/#INODE (deleted)`. Tests that must act while a
conversion is writing wait for it this way."""

from __future__ import annotations

import os


def building_in(pid: int, directory) -> bool:
    """Whether process `pid` holds an unnamed file in `directory`."""
    prefix = os.fspath(directory) + "/#"
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
        except OSError:
            continue
    return False
