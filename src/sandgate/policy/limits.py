"""Per-session resource limits as data: sizes and CPU counts (the policy's ``limits`` table
is ``model.LimitsSpec``, read with these functions).

Pure (no kernel, and no pydantic: `sandgate run` imports this module, and pydantic costs
~100 ms CPU to import, issue 13). The CLI, the policy loader and sandbox/limits.py (which
applies them through cgroups) all read limits through these functions, so ``--memory 2G``
and ``memory = "2G"`` in a profile mean the same bytes.

    [profiles.coder.limits]
    pids = 512          # processes and threads, all together
    memory = "2G"       # RAM, with swap off for the session
    cpus = 1.5          # CPU time: 1.5 cores' worth per period
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PIDS = 1024
MIN_MEMORY = 1 << 20  # below a MiB nothing starts; say so instead of trying
MIN_PIDS = 8  # nsenter, setpriv, bwrap and its init need a few before the command runs

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class LimitError(ValueError):
    """A limit written wrong: what was given and how to write it."""


def parse_size(text: str | int) -> int:
    """``256M``, ``2G``, ``1.5G``, ``512MiB``, or a number of bytes -> bytes (binary units)."""
    if isinstance(text, bool):
        raise LimitError(f"{text!r}: write a size such as 256M or 2G")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        if m is None:
            raise LimitError(f"{text!r}: write a size such as 256M or 2G")
        value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value < MIN_MEMORY:
        raise LimitError(f"{text!r} is less than 1M: nothing can start in that")
    return value


def parse_cpus(text: str | float) -> float:
    """``1.5`` -> 1.5 cores' worth of CPU time; more than 0, at most 1024."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise LimitError(f"{text!r}: write a number of CPUs such as 1 or 1.5") from None
    if not 0.01 <= value <= 1024:
        raise LimitError(f"{text!r}: CPUs must be between 0.01 and 1024")
    return value


def parse_pids(text: str | int) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise LimitError(f"{text!r}: write a whole number of processes such as 512") from None
    if value < MIN_PIDS:
        raise LimitError(f"{value}: a session needs at least {MIN_PIDS} processes to start")
    return value


def format_size(value: int) -> str:
    """Bytes for people: ``256M``, ``2G``, ``11.8G`` (3 significant digits)."""
    for unit in ("T", "G", "M", "K"):
        if value >= _UNITS[unit]:
            return f"{value / _UNITS[unit]:.4g}{unit}"
    return f"{value}B"


@dataclass(frozen=True)
class Limits:
    """What one session may use; None means "not set here" (a later layer or the default)."""

    pids: int | None = None
    memory: int | None = None  # bytes
    cpus: float | None = None

    def over(self, lower: Limits) -> Limits:
        """These limits, with ``lower``'s where these leave one unset (run over profile)."""
        return Limits(
            pids=self.pids if self.pids is not None else lower.pids,
            memory=self.memory if self.memory is not None else lower.memory,
            cpus=self.cpus if self.cpus is not None else lower.cpus,
        )

    def with_defaults(self, host_memory: int) -> Limits:
        """Defaults that keep the host alive: 1,024 processes, half the host's RAM."""
        return Limits(
            pids=self.pids if self.pids is not None else DEFAULT_PIDS,
            memory=self.memory if self.memory is not None else host_memory // 2,
            cpus=self.cpus,
        )

    @classmethod
    def parse(
        cls, pids: str | int | None, memory: str | int | None, cpus: str | float | None
    ) -> Limits:
        return cls(
            pids=None if pids is None else parse_pids(pids),
            memory=None if memory is None else parse_size(memory),
            cpus=None if cpus is None else parse_cpus(cpus),
        )
