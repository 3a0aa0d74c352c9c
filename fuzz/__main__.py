"""``python -m fuzz [SECONDS] [--json] [--only NAME ...]`` (``fuzz/run``): every fuzz target in
fuzz/targets.py for a share of SECONDS (default 60) with hypothesis, in batches until its time
is up. Prints per target the inputs tried, crashes found and the time taken; saves a crash's
shrunk input under fuzz/crashes/ (or --out) and exits 1 if any target crashed."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from fuzz.targets import TARGETS, Target

_BATCH = 500  # examples per hypothesis run; runs repeat until the target's time is up


@dataclass
class Result:
    name: str
    inputs: int = 0
    crashes: int = 0
    seconds: float = 0.0
    saved: list[str] = field(default_factory=list)


def fuzz_one(target: Target, seconds: float, out: Path) -> Result:
    result = Result(target.name)
    last_failure: list[tuple[Any, str]] = []
    stop = time.monotonic() + seconds

    def run(value: Any) -> None:
        result.inputs += 1
        try:
            target.check(value)
        except Exception:
            # Hypothesis replays the shrunk example last: the last failure is the one to keep.
            last_failure[:] = [(value, traceback.format_exc())]
            raise

    test = settings(
        max_examples=_BATCH,
        deadline=None,
        database=None,  # a fresh random search each batch
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )(given(target.strategy)(run))
    start = time.monotonic()
    while time.monotonic() < stop:
        try:
            test()
        except Exception as exc:  # a crash (hypothesis re-raises the check's error)
            value, where = last_failure[0] if last_failure else (None, repr(exc))
            saved = str(_save(out, target.name, value, where))
            if saved not in result.saved:  # distinct shrunk inputs, not repeats of one
                result.saved.append(saved)
                result.crashes += 1
            last_failure.clear()
    result.seconds = time.monotonic() - start
    return result


def _save(out: Path, name: str, value: Any, where: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    text = repr(value)
    path = out / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.txt"
    path.write_text(f"target: {name}\ninput: {text}\n\n{where}")
    if isinstance(value, bytes):
        path.with_suffix(".bin").write_bytes(value)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fuzz/run", description=__doc__)
    parser.add_argument("seconds", nargs="?", type=float, default=60.0, help="total budget")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--only", action="append", choices=sorted(TARGETS), help="repeatable")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).resolve().parent / "crashes",
        help="where failing inputs are saved (default fuzz/crashes/)",
    )
    args = parser.parse_args(argv)
    names = args.only or sorted(TARGETS)
    share = args.seconds / len(names)
    results = []
    for name in names:
        r = fuzz_one(TARGETS[name], share, args.out)
        results.append(r)
        if not args.json:
            saved = f"  saved: {', '.join(r.saved)}" if r.saved else ""
            print(
                f"{name:14} {r.inputs:>10} inputs  {r.crashes} crashes  {r.seconds:7.1f} s" + saved,
                flush=True,
            )
    total = sum(r.inputs for r in results)
    crashes = sum(r.crashes for r in results)
    if args.json:
        doc = {
            "seconds": args.seconds,
            "targets": {
                r.name: {
                    "inputs": r.inputs,
                    "crashes": r.crashes,
                    "seconds": round(r.seconds, 1),
                    "saved": r.saved,
                }
                for r in results
            },
            "inputs": total,
            "crashes": crashes,
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        print(f"{'total':14} {total:>10} inputs  {crashes} crashes")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
