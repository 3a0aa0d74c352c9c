"""``python -m sandgate`` and the ``sandgate`` command.

A ``run`` whose arguments sandgate/runcli.py reads goes straight to its body: no typer, no
pydantic (issue 13: ~100 ms CPU of a run's 200 ms). Everything else, including every error
and ``--help``, is typer's (cli.py).
"""

from __future__ import annotations

import gc
import sys

from sandgate import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


def main() -> Any:
    # No collection while the modules load: what they make lives as long as the process,
    # and the collector's passes over it cost a run ~25 ms CPU of ~190 (issue 13,
    # 2026-12-02). run_command freezes what is loaded and turns the collector back on.
    gc.disable()
    from sandgate.runcli import fast_main

    code = fast_main(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    gc.enable()
    from sandgate.cli import typer_main

    return typer_main()


if __name__ == "__main__":
    sys.exit(main())
