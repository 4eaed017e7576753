"""The ``zt`` command: ``python -m zt`` and the ``zt`` script installed with
the package.

Both run the Rust CLI itself (``zt._zt.cli_main``), the program the cargo
binary runs: the same output, exit statuses and progress line.
"""

from __future__ import annotations

import signal
import sys

from ._zt import cli_main


def main() -> int:
    """Run ``zt`` on this process's arguments; return its exit status."""
    # Ctrl-C ends the program at once, as it ends the binary. Python's own
    # handler would only set a flag that the native code never looks at, so
    # a long conversion would run to its end before KeyboardInterrupt.
    # Writers publish by rename, so nothing appears at the destination.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # "zt", not sys.argv[0] (a script path, or __main__.py): usage and
    # errors then read as the binary's do.
    return cli_main(["zt", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
