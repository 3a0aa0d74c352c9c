"""The guests a gateway serves, on disk, so a restarted gateway can give them their links back.

One root-only JSON file per guest under the instance's run directory: how it was added (the
control message) and its index in the pool (so it gets the same addresses again).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _dir(run_dir: Path) -> Path:
    path = run_dir / "guests"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def save(run_dir: Path, name: str, index: int, msg: dict[str, Any]) -> None:
    path = _dir(run_dir) / f"{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"index": index, "msg": msg}))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def forget(run_dir: Path, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (_dir(run_dir) / f"{name}.json").unlink()


def load(run_dir: Path) -> Iterator[tuple[str, int, dict[str, Any]]]:
    for path in sorted(_dir(run_dir).glob("*.json")):
        try:
            raw = json.loads(path.read_text())
            yield path.stem, int(raw["index"]), dict(raw["msg"])
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)
