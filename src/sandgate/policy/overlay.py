"""Policy overlays: a file that adds rules to another policy, for review before they are merged.

```toml
extends = "p.toml"              # relative to this file; "<built-in default>" for the default
[profiles.coder]
allow = [ { domain = "pypi.org", port = 443 } ]
```

An overlay names the policy it extends and, for profiles of that policy, more ``allow`` and
``deny`` rules, appended after the policy's own (deny still wins). Nothing else: a mode, a
secret or a new profile belongs in the policy itself. ``sandgate policy suggest`` writes one,
and so does ``sandgate approve --always``; ``sandgate run --policy overlay.toml`` runs with the
policy and the overlay together, and ``sandgate policy check overlay.toml`` checks both.

The extended policy is loaded first (its problems name its own lines); the overlay's are named
at the overlay's lines; a rule of the overlay that repeats or is made dead by one of the
policy's is named at the overlay's line, with the policy rule it meets. The models are here;
loading and merging are policy/load.py's (``parse_overlay``, ``apply_overlay``).
"""

from __future__ import annotations

from pydantic import Field

from sandgate.policy.model import RuleSpec, _Strict

__all__ = ["BUILTIN_NAME", "EXTENDS", "OverlayFile", "OverlayProfile"]

EXTENDS = "extends"
BUILTIN_NAME = "<built-in default>"


class OverlayProfile(_Strict):
    allow: list[RuleSpec] = Field(default_factory=list)
    deny: list[RuleSpec] = Field(default_factory=list)


class OverlayFile(_Strict):
    extends: str = Field(description="the policy this file adds rules to")
    profiles: dict[str, OverlayProfile] = Field(default_factory=dict)
