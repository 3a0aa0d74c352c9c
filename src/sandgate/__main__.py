"""``python -m sandgate``: the same as the ``sandgate`` command."""

from sandgate.cli import main

main()
