"""sandgate: AI agents in sandboxes behind a gateway that logs and gates their network."""

# typing.TYPE_CHECKING without importing typing: `from sandgate import TYPE_CHECKING` keeps
# typing (~4 ms CPU) out of a run (issue 13). mypy takes any name TYPE_CHECKING as True.
TYPE_CHECKING = False
