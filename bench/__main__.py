"""``python -m bench foundation|proxy|scale|homelab|vm [--json] [--quick] [--only PART ...]``
(bench/run)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from bench.foundation import PARTS, main_foundation, render
from sandgate.session.runner import signals_raise


def _clean(value: Any) -> Any:
    """JSON without NaN (null instead), so any parser reads it."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    parser.add_argument("suite", choices=["foundation", "proxy", "scale", "homelab", "vm"])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer, shorter runs (foundation < 1 min, proxy < 90 s)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(set(PARTS) | {"guests", "rules", "soak"}),
        help="run only this part (repeatable): foundation's, or scale's guests|rules|soak",
    )
    parser.add_argument(
        "--sessions", type=int, help="scale: soak sessions (default 1000, --quick 50)"
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        sys.stderr.write("bench/run needs root (namespaces, links, nftables)\n")
        return 2
    if args.suite == "vm":  # issue 9: VM guests beside a namespace guest
        from bench import vm

        with signals_raise():
            result = vm.main_vm(args.quick)
        text = vm.render(result)
    elif args.suite == "scale":
        from bench import scale

        wrong = set(args.only or ()) - set(scale.PARTS)
        if wrong:
            parser.error(f"scale's parts are {', '.join(scale.PARTS)}, not {', '.join(wrong)}")
        with signals_raise():
            result = scale.main_scale(args.quick, args.sessions, tuple(args.only or scale.PARTS))
        text = scale.render(result)
    elif args.suite == "homelab":
        from bench import homelab

        with signals_raise():
            result = homelab.main_homelab(args.quick)
        text = homelab.render(result)
    elif args.suite == "proxy":
        from bench import proxy

        if args.only:
            parser.error("--only is for the foundation suite")
        with signals_raise():
            result = proxy.main_proxy(args.quick)
        text = proxy.render(result)
    else:
        wrong = set(args.only or ()) - set(PARTS)
        if wrong:
            parser.error(f"foundation's parts are {', '.join(PARTS)}, not {', '.join(wrong)}")
        parts = [p for p in PARTS if not args.only or p in args.only]
        with signals_raise():
            result = main_foundation(parts, args.quick)
        text = render(result)
    if args.json:
        sys.stdout.write(json.dumps(_clean(result), indent=2) + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
