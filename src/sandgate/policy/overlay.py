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
policy's is named at the overlay's line, with the policy rule it meets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from sandgate.errors import PolicyError, PolicyProblem
from sandgate.policy.locate import Position, find
from sandgate.policy.model import RuleSpec, _Strict

__all__ = ["EXTENDS", "OverlayFile", "apply_overlay", "parse_overlay"]

EXTENDS = "extends"
BUILTIN_NAME = "<built-in default>"


class OverlayProfile(_Strict):
    allow: list[RuleSpec] = Field(default_factory=list)
    deny: list[RuleSpec] = Field(default_factory=list)


class OverlayFile(_Strict):
    extends: str = Field(description="the policy this file adds rules to")
    profiles: dict[str, OverlayProfile] = Field(default_factory=dict)


def parse_overlay(raw: dict[str, Any], positions: dict[Any, Position], source: str) -> Any:
    """The policy an overlay file extends, with the overlay's rules added (a ``Policy``)."""
    from sandgate.policy import load

    try:
        overlay = OverlayFile.model_validate(raw)
    except ValidationError as exc:
        found = [load._problem_from_pydantic(e, positions, source) for e in exc.errors()]
        if any(e["loc"][:1] not in (("extends",), ("profiles",)) for e in exc.errors()):
            found.append(
                PolicyProblem(
                    source,
                    None,
                    None,
                    "an overlay (a file with 'extends') holds only extends and the allow "
                    "and deny lists of profiles.NAME tables",
                    "put modes, secrets and new profiles in the policy it extends",
                )
            )
        raise PolicyError(sorted(found, key=load._in_file_order)) from None
    if overlay.extends == BUILTIN_NAME:
        base = load.load_policy(None)
    else:
        target = Path(overlay.extends)
        if not target.is_absolute() and source != BUILTIN_NAME:
            target = Path(source).resolve().parent / target
        if target.resolve() == Path(source).resolve():
            pos = find(positions, (EXTENDS,))
            raise PolicyError([load._located(source, pos, "an overlay cannot extend itself", "")])
        base = load.load_policy(target)
    return apply_overlay(base, overlay, positions, source)


def apply_overlay(
    base: Any, overlay: OverlayFile, positions: dict[Any, Position], source: str
) -> Any:
    """``base`` (a ``Policy``) with the overlay's rules appended to its profiles."""
    from sandgate.policy import load

    problems: list[PolicyProblem] = []
    profiles = dict(base.file.profiles)
    origins = dict(base.origins)
    for name, extra in overlay.profiles.items():
        spec = profiles.get(name)
        if spec is None:
            problems.append(
                load._located(
                    source,
                    find(positions, ("profiles", name)),
                    f"{base.source} has no profile {name!r} to add rules to",
                    f"choose one of {', '.join(sorted(profiles))}",
                )
            )
            continue
        for action in ("allow", "deny"):
            mine: list[RuleSpec] = getattr(spec, action)
            for i in range(len(mine)):
                key = ("profiles", name, action, i)
                origins.setdefault(key, (base.source, find(base.positions, key)))
            for j in range(len(getattr(extra, action))):
                at = ("profiles", name, action, j)
                origins[("profiles", name, action, len(mine) + j)] = (source, find(positions, at))
        profiles[name] = spec.model_copy(
            update={"allow": spec.allow + extra.allow, "deny": spec.deny + extra.deny}
        )
    if problems:
        raise PolicyError(problems)
    file = base.file.model_copy(update={"profiles": profiles})
    merged = load.Policy(file, source, base.positions, origins, base.source)
    merged.check()
    return merged
