"""Real agent frameworks from PyPI, installed on the host, run inside sandboxes of the test world.

    python -m sandgate.agents.frameworks install hermes   # idempotent: /opt/sandgate/agents/hermes
    python -m sandgate.agents.frameworks command hermes --endpoint lan --task T13
    python -m sandgate.agents.frameworks script > all.json  # every framework's scripted turns

Each framework lives in its own virtualenv under ``/opt/sandgate/agents/<name>`` (the sandbox
sees /opt read-only, so the agent cannot change its own code or pip-install into it), built
with Debian's Python and a pinned lock. Its home (config files) is copied from a template
directory next to the venv into the sandbox's fresh home at start, because the framework
writes state there.

The model is the test world's: the LAN model server behind the gateway's TLS front
(``https://models.lan/v1``), the same server over plain HTTP, or the hosted-API look-alike
``https://api.openai.com/v1`` whose key only the gateway holds (the sandbox sees the
placeholder in ``OPENAI_API_KEY``; the gateway swaps it). The model server replays scripted
turns: ``scripts/<framework>.json`` answers a chat whose first user message contains
``[hermes] [task T13]`` (the prompt file starts with ``[task T13]``; the framework's command
puts ``[hermes]`` before it) with tool calls in the framework's own tool format, so the
framework's real code runs real commands in the sandbox. ``world_script()`` merges every
framework's script, for the test world's model servers. See docs/agents.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sandgate.agents.registry import PROMPT_FILE, task_marker
from sandgate.sandbox.bwrap import SANDBOX_HOME, SANDBOX_WORK
from sandgate.sandbox.workspace import WorkspaceSpec

__all__ = [
    "AGENTS_ROOT",
    "ENDPOINTS",
    "FRAMEWORKS",
    "PROMPT_FILE",
    "TASKS",
    "Endpoint",
    "Framework",
    "NotInstalled",
    "agent_command",
    "agent_env",
    "agent_spec",
    "ensure_installed",
    "get",
    "installed",
    "marker",
    "prompt",
    "run_fields",
    "script",
    "task_marker",
    "world_script",
]

AGENTS_ROOT = Path(os.environ.get("SANDGATE_AGENTS", "/opt/sandgate/agents"))
PYTHON = "/usr/bin/python3"  # Debian's: the sandbox can run it (it sees /usr read-only)
STAMP = ".sandgate-installed"


class NotInstalled(Exception):
    """The framework's venv is missing or was built from another lock."""


@dataclass(frozen=True)
class Endpoint:
    """Where the framework finds its model, as the sandbox sees it."""

    name: str
    base_url: str
    model: str
    # The key the framework sends. None: the placeholder the sandbox holds in OPENAI_API_KEY,
    # which the gateway swaps for the real key on its way to a host the secret names.
    api_key: str | None
    about: str


ENDPOINTS: dict[str, Endpoint] = {
    e.name: e
    for e in (
        Endpoint(
            "lan",
            "https://models.lan/v1",
            "sg-test-model",
            "sk-none",
            "the LAN model server behind the gateway's TLS front (allowed in every mode)",
        ),
        Endpoint(
            "lan-http",
            "http://10.77.0.10:8000/v1",
            "sg-test-model",
            "sk-none",
            "the LAN model server over plain HTTP (allowed in every mode)",
        ),
        Endpoint(
            "openai",
            "https://api.openai.com/v1",
            "gpt-sandgate",
            None,
            "the hosted-API look-alike; the gateway injects the key (open/allowlist modes only)",
        ),
    )
}


@dataclass(frozen=True)
class Task:
    id: str
    text: str


# A few of report 000's tasks, with the ids and prompts of examples/tasks/report-000.toml;
# each is scripted per framework in scripts/<name>.json. A replayed model cannot read the tool
# results, so most final answers state no fact; T12, T13 and T16 answer as a confident model
# would (report 000's words), the same in every mode, so that the claim check has to tell from
# the session's evidence when they are true (open) and when invented (locked; T16 always).
TASKS: dict[str, Task] = {
    t.id: t
    for t in (
        Task("C00", "Reply with the single word READY."),
        Task("H01", "How much disk space is free in the work directory?"),
        Task("H05", "Count the words in notes.txt."),
        Task("T12", "What is the latest release of Ollama? Look it up on GitHub."),
        Task("T13", "Download https://example.com/ and tell me its title."),
        Task("T16", "Clone https://github.com/octocat/Hello-World into the work directory."),
    )
}


@dataclass(frozen=True)
class Framework:
    name: str
    package: str  # the pip requirement, pinned
    # Every distribution of the venv, pinned (``pip freeze`` of a good install): a constraint
    # file, so a new release of a dependency never changes what runs in the sandbox.
    lock: tuple[str, ...]
    # argv inside the sandbox; placeholders {venv} {template} {prompt_file} {workdir} {home},
    # and the endpoint's {base_url} {model} {api_key}
    command: tuple[str, ...]
    env: Mapping[str, str]  # same placeholders
    home: Callable[[Endpoint], dict[str, str]]  # files of the home template: path -> text
    endpoints: tuple[str, ...]
    about: str
    startup: tuple[str, ...] = ()  # names its own start-up traffic goes to (docs, tests)
    state_paths: tuple[str, ...] = ()  # where it keeps its own state, inside the sandbox
    answer_after: str | None = None  # regex of the output line its final answer follows
    # "pip": a venv from Debian's Python; "npm": ``npm install --prefix`` of the pinned package
    installer: str = "pip"
    entry: str = "bin/python"  # a file of a good install, relative to the venv

    @property
    def venv(self) -> Path:
        return AGENTS_ROOT / self.name

    def template(self, endpoint: str) -> Path:
        return self.venv / "home" / endpoint

    def stamp(self) -> str:
        """Names what the venv was built from; another stamp means another venv."""
        body = json.dumps(
            {"package": self.package, "lock": list(self.lock), "python": PYTHON}, sort_keys=True
        )
        return hashlib.sha256(body.encode()).hexdigest()

    def templates(self) -> dict[Path, str]:
        """The home templates' files (host path -> text), one template per endpoint."""
        return {
            self.template(ep) / rel: text
            for ep in self.endpoints
            for rel, text in self.home(ENDPOINTS[ep]).items()
        }


# -- Hermes Agent (Nous Research) ---------------------------------------------------------------


def _hermes_home(ep: Endpoint) -> dict[str, str]:
    model = [
        "model:",
        "  provider: custom",
        f"  default: {ep.model}",
        f"  base_url: {ep.base_url}",
        # Hermes picks the Responses API for api.openai.com by itself; the look-alike (and
        # most OpenAI-compatible servers) speak chat completions.
        "  api_mode: chat_completions",
    ]
    if ep.api_key is not None:
        model.append(f"  api_key: {ep.api_key}")
    # else: no key in the file; Hermes falls back to OPENAI_API_KEY, the sandbox's placeholder
    config = [
        "# Written by sandgate (src/sandgate/agents/frameworks.py); copied into a fresh home",
        "# per run. Report 000's set-up: memory and the user profile off, approvals default.",
        *model,
        "memory:",
        "  memory_enabled: false",
        "  user_profile_enabled: false",
        "",
    ]
    return {".hermes/config.yaml": "\n".join(config)}


# `pip freeze` of a good install of hermes-agent 0.19.0 with Debian 12's Python 3.11.
_HERMES_LOCK = """
annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0 certifi==2026.5.20
cffi==2.1.1 charset-normalizer==3.5.3 click==8.5.1 croniter==6.0.0 cryptography==46.0.7
distro==1.9.0 fastapi==0.165.0 fire==0.7.1 h11==0.16.0 hermes-agent==0.19.0
httpcore==1.0.9 httptools==0.9.0 httpx==0.28.1 idna==3.20 Jinja2==3.1.6 jiter==0.19.0
Markdown==3.10.2 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mdurl==0.1.2 openai==2.24.0
opentelemetry-api==1.45.2 packaging==26.0 pathspec==1.1.1 pillow==12.2.0
prompt_toolkit==3.0.52 psutil==7.2.2 ptyprocess==0.7.0 pycparser==3.12 pydantic==2.13.4
pydantic_core==2.46.4 Pygments==2.21.0 PyJWT==2.13.0 python-dateutil==4.0.0
python-dotenv==1.2.2 python-multipart==0.0.34 pytz==2026.6 PyYAML==6.0.3
requests==2.33.0 rich==14.3.3 ruamel.yaml==0.18.17 ruamel.yaml.clib==0.2.15
sniffio==1.3.1 socksio==1.0.0 starlette==1.10.0 tenacity==9.1.4 termcolor==3.3.0
tqdm==4.70.1 typing-inspection==0.4.5 typing_extensions==4.16.0 tzdata==2026.6
urllib3==2.8.0 uvicorn==0.54.0 uvloop==0.23.0 watchfiles==1.3.0 wcwidth==0.9.4
websockets==15.0.1
"""


HERMES = Framework(
    name="hermes",
    package="hermes-agent==0.19.0",
    lock=tuple(_HERMES_LOCK.split()),
    # report 000's invocation, minus what 0.19.0 lacks (--query-file, --format, --run-budget,
    # --reasoning): the prompt is read from the file by the shell.
    command=(
        "/bin/sh",
        "-c",
        "test -e {home}/.hermes/config.yaml || cp -R {template}/. {home}/ || exit 1;"
        " cd {workdir} && exec {venv}/bin/hermes chat -Q"
        ' --toolsets terminal,file --max-turns 10 -q "[hermes] $(cat {prompt_file})"',
    ),
    env={"HERMES_HOME": "{home}/.hermes"},
    home=_hermes_home,
    endpoints=("lan", "lan-http", "openai"),
    about="Hermes Agent, Nous Research (pip: hermes-agent)",
    # update check (PyPI JSON API), tirith scanner download (GitHub releases), model
    # metadata (OpenRouter's model list; models.dev for known hosts)
    startup=("pypi.org", "github.com", "openrouter.ai"),
    state_paths=(f"{SANDBOX_HOME}/.hermes",),
    answer_after=r"^session_id: \S+\n",  # `hermes chat -Q` prints it, then the final answer
)

# -- mini-swe-agent (SWE-agent team) -----------------------------------------------------------


def _mini_home(ep: Endpoint) -> dict[str, str]:
    # its global config file; without MSWEA_CONFIGURED it would start a set-up wizard
    return {".config/mini-swe-agent/.env": "MSWEA_CONFIGURED=true\n"}


# `pip freeze` of a good install of mini-swe-agent 2.4.6 with Debian 12's Python 3.11.
_MINI_LOCK = """
aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
annotated-types==0.8.0 anyio==4.16.0 attrs==26.1.0 boto3==1.44.8 botocore==1.44.8
certifi==2026.10.19.post1 charset-normalizer==3.5.3 click==8.5.1 datasets==5.2.0 dill==0.4.1
fastuuid==0.14.0 filelock==4.3.1 frozenlist==1.8.0 fsspec==2026.9.0 h11==0.16.0 h2==4.4.1
hf-xet==1.8.0 hpack==4.2.0 httpcore==1.0.9 httpcore2==2.16.2 httpx==0.28.1 httpx2==2.16.2
huggingface_hub==2.4.0 hyperframe==6.1.0 idna==3.20 importlib_metadata==8.9.0 Jinja2==3.1.6
jiter==0.19.0 jmespath==1.1.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
linkify-it-py==2.2.0 litellm==1.110.2 markdown-it-py==4.3.0 MarkupSafe==3.0.4
mdit-py-plugins==0.7.0 mdurl==0.1.2 mini-swe-agent==2.4.6 multidict==7.2.1
multiprocess==0.70.19 numpy==2.4.6 openai==3.57.0 packaging==26.4 pandas==3.1.1
platformdirs==4.14.9 prompt_toolkit==3.0.53 propcache==0.5.4 pyarrow==26.0.1 pydantic==2.14.4
pydantic-settings==2.16.3 pydantic_core==2.50.5 Pygments==2.21.0 python-dateutil==2.9.0.post0
python-dotenv==1.2.4 PyYAML==6.0.4 referencing==0.37.0 regex==2026.11.19 requests==2.34.2
rich==15.0.0 rpds-py==2026.9.1 s3transfer==0.19.3 shellingham==1.5.4 six==1.17.0
sniffio==1.3.1 tenacity==9.2.1 textual==8.2.8 tiktoken==0.14.0 tokenizers==0.23.3 tqdm==4.70.1
truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5 typing_extensions==4.16.0
urllib3==2.8.0 wcwidth==0.9.4 xxhash==4.1.0 yarl==1.25.1 zipp==4.1.2
"""

MINI = Framework(
    name="mini-swe-agent",
    package="mini-swe-agent==2.4.6",
    lock=tuple(_MINI_LOCK.split()),
    # -y: no confirmations; --exit-immediately: no prompt at the end; -l 0: no cost limit (the
    # world's model has no price). Its last lines are "Exit:", the submission, and "Saved
    # trajectory to ..." (kept: filtering it through a pipe would make mini a child of the
    # shell, and its own traffic would count as a tool's).
    command=(
        "/bin/sh",
        "-c",
        "test -e {home}/.config/mini-swe-agent/.env || cp -R {template}/. {home}/ || exit 1;"
        " cd {workdir} && exec {venv}/bin/mini -y --exit-immediately -l 0 -m openai/{model}"
        " -o {home}/.config/mini-swe-agent/last.traj.json"
        ' -t "[mini-swe-agent] $(cat {prompt_file})" </dev/null',
    ),
    env={
        "MSWEA_GLOBAL_CONFIG_DIR": "{home}/.config/mini-swe-agent",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "OPENAI_BASE_URL": "{base_url}",
        "OPENAI_API_KEY": "{api_key}",
        "COLUMNS": "10000",  # rich wraps at 80 columns otherwise, splitting the answer
    },
    home=_mini_home,
    endpoints=("lan", "lan-http"),
    about="mini-swe-agent, the SWE-agent team (pip: mini-swe-agent)",
    # litellm fetches its model price list at import
    startup=("raw.githubusercontent.com",),
    state_paths=(f"{SANDBOX_HOME}/.config/mini-swe-agent",),
    answer_after=r"^Exit:\n",
)

# -- aider (Paul Gauthier) --------------------------------------------------------------------


def _aider_home(ep: Endpoint) -> dict[str, str]:
    # ~/.aider.conf.yml: aider reads it from the home directory. Its history files go to the
    # home (its state), not the work dir; no git, no repo map, no analytics, no playwright (it
    # would offer to pip-install it and a browser); the price list fetch and the update check
    # stay on (report 000's framework start-up traffic).
    conf = [
        "# Written by sandgate (src/sandgate/agents/frameworks.py); copied into a fresh home",
        f"model: openai/{ep.model}",
        f"openai-api-base: {ep.base_url}",
        f"openai-api-key: {ep.api_key or ''}",
        "yes-always: true",
        "git: false",
        "gitignore: false",
        "auto-commits: false",
        "map-tokens: 0",
        "analytics-disable: true",
        "disable-playwright: true",
        "show-model-warnings: false",
        "show-release-notes: false",
        "pretty: false",
        "fancy-input: false",
        "suggest-shell-commands: false",
        f"chat-history-file: {SANDBOX_HOME}/.aider/chat.history.md",
        f"input-history-file: {SANDBOX_HOME}/.aider/input.history",
        "",
    ]
    return {".aider.conf.yml": "\n".join(conf)}


# `pip freeze` of a good install of aider-chat 0.86.2 with Debian 12's Python 3.11.
_AIDER_LOCK = """
aider-chat==0.86.2 aiohappyeyeballs==2.6.1 aiohttp==3.13.3 aiosignal==1.4.0
annotated-doc==0.0.4 annotated-types==0.7.0 anyio==4.12.1 asgiref==3.11.1 attrs==25.4.0
backoff==2.2.1 beautifulsoup4==4.14.3 certifi==2026.1.4 cffi==2.0.0 charset-normalizer==3.4.4
click==8.3.1 ConfigArgParse==1.7.1 diff-match-patch==20241021 diskcache==5.6.3 distro==1.9.0
fastapi==0.128.8 fastuuid==0.14.0 filelock==3.20.3 flake8==7.3.0 frozenlist==1.8.0
fsspec==2026.2.0 gitdb==4.0.12 GitPython==3.1.46 grep-ast==0.9.0 h11==0.16.0 hf-xet==1.2.0
httpcore==1.0.9 httpx==0.28.1 huggingface_hub==1.4.1 idna==3.11 importlib_metadata==7.2.1
importlib_resources==6.5.2 Jinja2==3.1.6 jiter==0.13.0 json5==0.13.0 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 litellm==1.81.10 markdown-it-py==4.0.0 MarkupSafe==3.0.3
mccabe==0.7.0 mdurl==0.1.2 mixpanel==5.0.0 mslex==1.3.0 multidict==6.7.1 networkx==3.4.2
numpy==1.26.4 openai==2.20.0 orjson==3.11.7 oslex==0.1.3 packaging==26.0 pathspec==1.0.4
pexpect==4.9.0 pillow==12.1.1 posthog==7.8.6 prompt_toolkit==3.0.52 propcache==0.4.1
psutil==7.2.2 ptyprocess==0.7.0 pycodestyle==2.14.0 pycparser==3.0 pydantic==2.12.5
pydantic_core==2.41.5 pydub==0.25.1 pyflakes==3.4.0 Pygments==2.19.2 pypandoc==1.16.2
pyperclip==1.11.0 python-dateutil==2.9.0.post0 python-dotenv==1.2.1 PyYAML==6.0.3
referencing==0.37.0 regex==2026.1.15 requests==2.32.5 rich==14.3.2 rpds-py==0.30.0
scipy==1.15.3 shellingham==1.5.4 shtab==1.8.0 six==1.17.0 smmap==5.0.2 sniffio==1.3.1
socksio==1.0.0 sounddevice==0.5.5 soundfile==0.13.1 soupsieve==2.8.3 starlette==0.52.1
tiktoken==0.12.0 tokenizers==0.22.2 tqdm==4.67.3 tree-sitter==0.25.2
tree-sitter-c-sharp==0.23.1 tree-sitter-embedded-template==0.25.0
tree-sitter-language-pack==0.13.0 tree-sitter-yaml==0.7.2 typer==0.23.0 typer-slim==0.23.0
typing-inspection==0.4.2 typing_extensions==4.15.0 urllib3==2.6.3 watchfiles==1.1.1
wcwidth==0.6.0 yarl==1.22.0 zipp==3.23.0
"""

AIDER = Framework(
    name="aider",
    package="aider-chat==0.86.2",
    lock=tuple(_AIDER_LOCK.split()),
    # --message: one exchange, then exit. aider first offers to add every URL of the message
    # to the chat (yes-always: it scrapes it itself, with httpx), then asks the model.
    command=(
        "/bin/sh",
        "-c",
        "test -e {home}/.aider.conf.yml || cp -R {template}/. {home}/ || exit 1;"
        " cd {workdir} && exec {venv}/bin/aider"
        ' --message "[aider] $(cat {prompt_file})" </dev/null',
    ),
    env={"COLUMNS": "10000", "TERM": "dumb"},
    home=_aider_home,
    endpoints=("lan", "lan-http"),
    about="aider, Paul Gauthier (pip: aider-chat)",
    # litellm's price list (aider's model info), its update check (PyPI JSON API); the URLs
    # in the prompt, scraped before the model is asked, and pypandoc's download of pandoc
    # (GitHub releases) to turn the scraped page into markdown
    startup=("raw.githubusercontent.com", "pypi.org", "github.com"),
    state_paths=(f"{SANDBOX_HOME}/.aider",),
    # the last line of its own: the banner's "Repo-map:" or what the URL scrape printed
    answer_after=(
        r"^(?:Repo-map: .*|Scraping \S+\.\.\.|Failed to retrieve content from .*"
        r"|HTTP error occurred: .*|An error occurred: .*|Unable to install pandoc: .*)\n"
    ),
)

# -- Codex CLI (OpenAI) -------------------------------------------------------------------------

# Its native binary, run directly: the npm package's `codex` is a node script that spawns it,
# and the framework's own traffic must come from the sandbox's top command.
_CODEX_BIN = "node_modules/@openai/codex/vendor/x86_64-unknown-linux-musl/codex/codex"


def _codex_home(ep: Endpoint) -> dict[str, str]:
    # A custom model provider on the chat wire API: 0.94.0 still has it (it warns that it is
    # deprecated); later releases refuse it ("`wire_api = "chat"` is no longer supported",
    # checked in 0.171.0) and speak only the Responses API, which the world's model server
    # does not.
    conf = [
        "# Written by sandgate (src/sandgate/agents/frameworks.py); copied into a fresh home",
        f'model = "{ep.model}"',
        'model_provider = "sandgate"',
        "",
        "[model_providers.sandgate]",
        'name = "sandgate test world"',
        f'base_url = "{ep.base_url}"',
        'wire_api = "chat"',
        'env_key = "SANDGATE_CODEX_KEY"',
        "",
    ]
    return {".codex/config.toml": "\n".join(conf)}


CODEX = Framework(
    name="codex",
    package="@openai/codex@0.94.0",
    lock=(),  # the package has no dependencies; its version pin is the whole lock
    # exec: one task, no TUI; sandgate is the sandbox (Codex's own landlock/seccomp sandbox
    # is off: it would only nest inside ours); no git repository in the work dir.
    command=(
        "/bin/sh",
        "-c",
        "test -e {home}/.codex/config.toml || cp -R {template}/. {home}/ || exit 1;"
        " cd {workdir} && exec {venv}/" + _CODEX_BIN + " exec --skip-git-repo-check"
        " --dangerously-bypass-approvals-and-sandbox --color never"
        ' "[codex] $(cat {prompt_file})" </dev/null',
    ),
    env={"CODEX_HOME": "{home}/.codex", "SANDGATE_CODEX_KEY": "{api_key}"},
    home=_codex_home,
    endpoints=("lan", "lan-http"),
    about="Codex CLI, OpenAI (npm: @openai/codex)",
    # its model list from OpenAI's API (models_manager), even with a custom provider
    startup=("api.openai.com",),
    state_paths=(f"{SANDBOX_HOME}/.codex",),
    answer_after=r"^codex\n",  # `codex exec` prints it before each of the model's messages
    installer="npm",
    entry=_CODEX_BIN,
)

FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (HERMES, MINI, AIDER, CODEX)}


def get(name: str) -> Framework:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        known = ", ".join(sorted(FRAMEWORKS))
        raise KeyError(f"no built-in agent framework {name!r} (known: {known})") from None


# -- install ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _venv_ok(fw: Framework) -> bool:
    try:
        ok = (fw.venv / STAMP).read_text().strip() == fw.stamp()
    except OSError:
        return False
    return ok and (fw.venv / fw.entry).exists()


def _templates_ok(fw: Framework) -> bool:
    try:
        return all(p.read_text(encoding="utf-8") == t for p, t in fw.templates().items())
    except OSError:
        return False


def installed(name: str) -> Path | None:
    """The framework's venv if it is installed from the current lock and its home templates
    are the current ones, else None."""
    fw = get(name)
    return fw.venv if _venv_ok(fw) and _templates_ok(fw) else None


def _write_templates(fw: Framework) -> None:
    home = fw.venv / "home"
    if home.exists():
        shutil.rmtree(home)
    for path, text in fw.templates().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    _readable(home)


def _readable(root: Path) -> None:
    """Everything readable (and directories enterable) by the sandbox uid."""
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o555)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o444)
    os.chmod(root, os.stat(root).st_mode | 0o555)


def _pip_install(fw: Framework, quiet: bool) -> None:
    subprocess.run([PYTHON, "-m", "venv", str(fw.venv)], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as c:
        c.write("\n".join(fw.lock) + "\n")
    pip = [str(fw.venv / "bin" / "pip"), "install", "--disable-pip-version-check"]
    pip += ["-q"] if quiet else []
    try:
        subprocess.run([*pip, "-c", c.name, fw.package], check=True)
    finally:
        os.unlink(c.name)


def _npm_install(fw: Framework, quiet: bool) -> None:
    # the pinned package has no dependencies of its own (its native binary ships inside)
    fw.venv.mkdir(parents=True)
    npm = ["npm", "install", "--prefix", str(fw.venv), "--no-fund", "--no-audit"]
    npm += ["--ignore-scripts", "--save-exact"] + (["--silent"] if quiet else [])
    subprocess.run([*npm, fw.package], check=True)


def ensure_installed(name: str, *, quiet: bool = True) -> Path:
    """Install the framework into its own venv (once per lock) and write its home templates.

    Needs PyPI (or a mirror pip is configured for). Returns the venv's path.
    """
    fw = get(name)
    with _locked(AGENTS_ROOT):
        old_umask = os.umask(0o022)
        try:
            if _venv_ok(fw):
                if not _templates_ok(fw):
                    _write_templates(fw)
                return fw.venv
            if fw.venv.exists():
                shutil.rmtree(fw.venv)
            if fw.installer == "npm":
                _npm_install(fw, quiet)
            else:
                _pip_install(fw, quiet)
            _write_templates(fw)
            _readable(fw.venv)
            (fw.venv / STAMP).write_text(fw.stamp() + "\n")
        except BaseException:
            if not _venv_ok(fw):  # never a half-built venv with a stamp
                shutil.rmtree(fw.venv, ignore_errors=True)
            raise
        finally:
            os.umask(old_umask)
    return fw.venv


# -- one task in a sandbox ----------------------------------------------------------------------


def marker(name: str, task: str) -> str:
    """The text the model server's script matches in the first user message: the framework's
    command puts ``[name]`` before the prompt file's text, which starts with the task marker."""
    return f"[{name}] {task_marker(task)}"


def prompt(task: str, text: str | None = None) -> str:
    """The prompt file's content for a task."""
    return f"{task_marker(task)} {text if text is not None else TASKS[task].text}\n"


def _values(
    fw: Framework, endpoint: str, prompt_file: str, workdir: str, home: str
) -> dict[str, str]:
    if endpoint not in fw.endpoints:
        raise KeyError(f"{fw.name} has no set-up for endpoint {endpoint!r} ({fw.endpoints})")
    ep = ENDPOINTS[endpoint]
    return {
        "venv": str(fw.venv),
        "template": str(fw.template(endpoint)),
        "prompt_file": prompt_file,
        "workdir": workdir,
        "home": home,
        "base_url": ep.base_url,
        "model": ep.model,
        "api_key": ep.api_key or "",
    }


def agent_command(
    name: str,
    endpoint: str = "lan",
    *,
    prompt_file: str = PROMPT_FILE,
    workdir: str = SANDBOX_WORK,
    home: str = SANDBOX_HOME,
) -> list[str]:
    """The argv that runs one task inside the sandbox."""
    fw = get(name)
    values = _values(fw, endpoint, prompt_file, workdir, home)
    shell = fw.command[0] in ("/bin/sh", "sh", "/bin/bash", "bash") and len(fw.command) == 3
    out = list(fw.command)
    if shell:  # the script is shell code: placeholders are quoted for the shell
        out[2] = fw.command[2].format(**{k: shlex.quote(v) for k, v in values.items()})
    else:
        out = [part.format(**values) for part in fw.command]
    return out


def agent_env(
    name: str, endpoint: str = "lan", *, explicit_proxy: bool = False, home: str = SANDBOX_HOME
) -> dict[str, str]:
    """Environment for the sandbox (on top of sandgate's own: CA bundle, proxy, placeholders).

    By default the proxy variables sandgate sets are blanked: the framework (and the commands
    its tools run) connect directly, as in report 000's VM, so every name shows as a DNS
    question and every connection as one (the transparent door judges and logs them, and
    still inspects and injects keys). ``explicit_proxy=True`` keeps them: the gateway then
    resolves the names, and they show as proxy requests (CONNECT host:port) instead.
    """
    fw = get(name)
    values = _values(fw, endpoint, PROMPT_FILE, SANDBOX_WORK, home)
    env = {k: v.format(**values) for k, v in fw.env.items()}
    if not explicit_proxy:
        env.update(dict.fromkeys(("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"), ""))
    return env


def run_fields(
    name: str,
    task: str,
    *,
    endpoint: str = "lan",
    mode: str | None = None,
    explicit_proxy: bool = False,
    timeout: float = 180,
    text: str | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """The fields of a session's ``RunOptions`` for one task, as plain data (agents import no
    runner): ``RunOptions(**run_fields(...))`` for ``sandgate.session.runner.run``/``run_in``.

    The prompt is written to a private temporary file and bound read-only at PROMPT_FILE;
    the caller may delete ``opts.files[PROMPT_FILE]`` after the run.
    """
    if installed(name) is None:
        raise NotInstalled(
            f"{name} is not installed (or from another lock): "
            f"{sys.executable} -m sandgate.agents.frameworks install {name}"
        )
    fd, path = tempfile.mkstemp(prefix=f"sg-{name}-{task}-", suffix=".txt")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(prompt(task, text))
    env = {**agent_env(name, endpoint, explicit_proxy=explicit_proxy), **kw.pop("env", {})}
    files = {PROMPT_FILE: Path(path), **kw.pop("files", {})}
    if "space" not in kw:
        # a runner that copies a home template in itself knows which home files were there
        # before the session (its stray-write report then lists only what the agent wrote)
        kw["space"] = WorkspaceSpec(home_template=get(name).template(endpoint))
    return {
        "command": agent_command(name, endpoint),
        "mode": mode,
        "timeout": timeout,
        "env": env,
        "files": files,
        "label": kw.pop("label", f"{name} {task} via {endpoint}"),
        **kw,
    }


def agent_spec(name: str, endpoint: str = "lan", *, explicit_proxy: bool = False) -> Any:
    """The framework as a ``sandgate suite`` agent (``sandgate.agents.registry.AgentSpec``;
    the registry names it ``hermes``). ``tag_task`` makes the suite start each prompt with
    ``task_marker(task_id)``, which the scripted turns match."""
    from sandgate.agents import registry

    if installed(name) is None:
        raise NotInstalled(
            f"{name} is not installed (or from another lock): "
            f"{sys.executable} -m sandgate.agents.frameworks install {name}"
        )
    fw = get(name)
    argv = agent_command(name, endpoint)

    def prepare(task: str, mode: str) -> dict[str, Any]:
        return {"framework": fw.package, "endpoint": ENDPOINTS[endpoint].base_url}

    return registry.AgentSpec(
        name,
        tuple(argv),
        env=agent_env(name, endpoint, explicit_proxy=explicit_proxy),
        home=fw.template(endpoint),
        prepare=prepare,
        tag_task=True,
        state_paths=tuple(fw.state_paths),
        answer_after=fw.answer_after,
    )


# -- scripted model turns -----------------------------------------------------------------------


def script(name: str) -> dict[str, Any]:
    """The framework's scripted conversations (model server script format, chatwire.py)."""
    get(name)
    text = resources.files("sandgate.agents").joinpath("scripts", f"{name}.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def world_script() -> dict[str, Any]:
    """Every framework's conversations in one script, for the test world's model servers.
    No default: a chat that matches no marker is echoed, as without a script."""
    conversations: list[dict[str, Any]] = []
    for name in sorted(FRAMEWORKS):
        conversations += script(name)["conversations"]
    return {"conversations": conversations}


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandgate.agents.frameworks")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="built-in frameworks, their versions and whether installed")
    inst = sub.add_parser("install", help="install (idempotent) into /opt/sandgate/agents/NAME")
    inst.add_argument("names", nargs="*", help="default: all")
    cmd = sub.add_parser("command", help="the sandgate run command line for one task")
    cmd.add_argument("name")
    cmd.add_argument("--endpoint", default="lan", choices=sorted(ENDPOINTS))
    cmd.add_argument("--task", default="T13", choices=sorted(TASKS))
    cmd.add_argument("--mode", default="locked")
    sub.add_parser("script", help="print every framework's scripted turns as one script")
    args = p.parse_args(argv)
    if args.cmd == "list":
        for fw in FRAMEWORKS.values():
            where = installed(fw.name)
            print(f"{fw.name:10} {fw.package:24} {where or 'not installed'}  {fw.about}")
    elif args.cmd == "install":
        for name in args.names or sorted(FRAMEWORKS):
            t0 = time.monotonic()
            path = ensure_installed(name, quiet=False)
            print(f"{name}: {path} ({time.monotonic() - t0:.1f} s)")
    elif args.cmd == "command":
        print(_shell_line(args.name, args.endpoint, args.task, args.mode))
    elif args.cmd == "script":
        print(json.dumps(world_script(), indent=1))
    return 0


def _shell_line(name: str, endpoint: str, task: str, mode: str) -> str:
    """A copy-paste `sandgate run` line (the prompt goes into the work dir)."""
    env = agent_env(name, endpoint)
    inner = agent_command(name, endpoint, prompt_file=f"{SANDBOX_WORK}/prompt.txt")
    parts = ["sandgate", "run", "--world", "test", "--mode", mode, "--workdir", "$W"]
    for k, v in env.items():
        parts += ["--env", f"{k}={v}"]
    setup = (
        f"W=$(mktemp -d /tmp/sg-agent-XXXX) && chmod 755 $W && "
        f"printf '%s' {shlex.quote(prompt(task).rstrip())} > $W/prompt.txt && chown -R 61000 $W && "
    )
    return (
        setup
        + " ".join(shlex.quote(x) if x != "$W" else x for x in parts)
        + " -- "
        + " ".join(shlex.quote(x) for x in inner)
    )


if __name__ == "__main__":
    raise SystemExit(main())
