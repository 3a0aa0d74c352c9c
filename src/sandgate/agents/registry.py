"""Which agent a suite runs: a built-in name or a command template.

    --agent scripted                                   sandgate's deterministic agent
    --agent 'my-agent --task {prompt_file} --cwd {workdir}'   any command; placeholders:
        {prompt_file}  the task's prompt, as a file inside the sandbox
        {workdir}      the work dir inside the sandbox (/work)
        {home}         the agent's home inside the sandbox (/home/agent)

A template is checked before anything runs: an unknown placeholder is an error that names it.
"""

from __future__ import annotations

import shlex
import string
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sandgate.errors import SandgateError
from sandgate.sandbox.bwrap import SANDBOX_HOME, SANDBOX_WORK

PROMPT_FILE = "/run/sandgate/prompt.txt"
AGENT_DIR = "/run/sandgate/agent"
PLACEHOLDERS = {"prompt_file": PROMPT_FILE, "workdir": SANDBOX_WORK, "home": SANDBOX_HOME}


@dataclass(frozen=True)
class AgentSpec:
    name: str
    argv: tuple[str, ...]  # placeholders filled in with sandbox paths
    files: dict[str, Path] = field(default_factory=dict)  # extra files bound in: target -> source
    env: dict[str, str] = field(default_factory=dict)
    home: Path | None = None  # a home template the agent needs (its config), if any
    # Per-task set-up on the host before a session; what it returns is recorded with it.
    prepare: Callable[[str, str], dict[str, Any]] | None = None
    # Start the prompt with "[task ID]": the test world's model server replays that task's
    # scripted turns for a real framework (agents/frameworks.py).
    tag_task: bool = False
    # Where the framework keeps its own state (its writes there are the framework's, reported
    # apart from the agent's stray writes).
    state_paths: tuple[str, ...] = ()
    # A regex for the output line after which the final answer starts (None: "ANSWER:").
    answer_after: str | None = None
    # The environment variable a suite sets to the session's mode, for an agent that replays
    # a recorded run per mode (the scripted agent replays report 000's, open T13 included).
    mode_env: str | None = None


def task_marker(task: str) -> str:
    """What a prompt starts with when the agent asks for it (``tag_task``): the test world's
    model server replays that task's scripted turns (agents/frameworks.py)."""
    return f"[task {task}]"


def package_file(name: str) -> Path:
    return Path(str(resources.files("sandgate.agents").joinpath(name)))


def scripted() -> AgentSpec:
    target = f"{AGENT_DIR}/scripted_agent.py"
    return AgentSpec(
        "scripted",
        ("/usr/bin/python3", target, PROMPT_FILE),
        files={target: package_file("scripted_agent.py")},
        mode_env="SANDGATE_REPLAY_MODE",
    )


def _framework(name: str) -> Callable[[], AgentSpec]:
    def spec() -> AgentSpec:
        from sandgate.agents import frameworks

        if frameworks.installed(name) is None:
            _install(name)
        try:
            found: AgentSpec = frameworks.agent_spec(name)
        except frameworks.NotInstalled as exc:  # installed, yet not what this lock asks for
            raise SandgateError(
                f"the {name} agent framework is not usable ({exc})",
                f"/opt/sandgate/venv/bin/python -m sandgate.agents.frameworks install {name}",
            ) from None
        return found

    return spec


def _install(name: str) -> None:
    """A framework's first use installs it (its own venv, pinned), with a line before and after:
    the set-up's quick path leaves out what only an agent framework needs."""
    from sandgate.agents import frameworks

    fw = frameworks.get(name)
    print(
        f"sandgate: first use of --agent {name}: installing {fw.package} into {fw.venv} "
        "(once; needs the package registry, a minute or more)",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.monotonic()
    try:
        frameworks.ensure_installed(name)
    except (OSError, subprocess.CalledProcessError) as exc:
        why = (
            f"{exc.cmd[0]} exited {exc.returncode}"
            if isinstance(exc, subprocess.CalledProcessError)
            else str(exc)
        )
        raise SandgateError(
            f"the {name} agent framework could not be installed ({why}; its output is above)",
            f"/opt/sandgate/venv/bin/python -m sandgate.agents.frameworks install {name} "
            "shows why (it needs the package registry, or a mirror pip is configured for)",
        ) from None
    print(
        f"sandgate: {name} installed ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True
    )


BUILTIN: dict[str, Callable[[], AgentSpec]] = {
    "scripted": scripted,
    "hermes": _framework("hermes"),
    "mini-swe-agent": _framework("mini-swe-agent"),
    "aider": _framework("aider"),
    "codex": _framework("codex"),
}


def builtin_names() -> list[str]:
    return sorted(BUILTIN)


def resolve(agent: str) -> AgentSpec:
    """A built-in agent by name, else a command template."""
    if agent in BUILTIN:
        return BUILTIN[agent]()
    return AgentSpec("command", parse_template(agent))


def parse_template(template: str) -> tuple[str, ...]:
    try:
        words = shlex.split(template)
    except ValueError as exc:
        raise SandgateError(f"agent command {template!r}: {exc}", "check the quotes") from None
    if not words:
        raise SandgateError(
            "the agent command is empty",
            f"give a built-in agent ({', '.join(builtin_names())}) or a command",
        )
    if len(words) == 1 and "/" not in words[0] and "{" not in words[0]:
        # One bare word that is not a built-in: probably a typo of one.
        known = ", ".join(builtin_names())
        raise SandgateError(
            f"unknown agent {words[0]!r}",
            f"built-in agents: {known}; or a command such as 'my-agent {{prompt_file}}'",
        )
    return tuple(fill(word) for word in words)


def fill(word: str) -> str:
    fields = []
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
    except ValueError as exc:
        raise SandgateError(
            f"agent command: {word!r}: {exc}", "write a literal brace as {{ or }}"
        ) from None
    for name in fields:
        if name not in PLACEHOLDERS:
            raise SandgateError(
                f"agent command: unknown placeholder {{{name}}}",
                "use {prompt_file}, {workdir} or {home}",
            )
    return word.format(**PLACEHOLDERS)
