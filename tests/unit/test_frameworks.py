"""Framework entries as data: commands, home templates and final-answer lines (no kernel).

The outputs are cut from real runs of aider 0.86.2 and Codex 0.94.0 in the test world
(tests/kernel/test_suite.py, 2026-12-01).
"""

from __future__ import annotations

import pytest

from sandgate.agents import frameworks
from sandgate.session.runner import final_answer

AIDER_LOCKED_T13 = """\
Error checking pypi for new version: HTTPSConnectionPool(host='pypi.org', port=443): Max retries
Aider v0.86.2
Model: openai/sg-test-model with whole edit format
Git repo: none
Repo-map: disabled


https://example.com/
Scraping https://example.com/...
HTTP error occurred: [Errno -2] Name or service not known
Failed to retrieve content from https://example.com/
I downloaded https://example.com/; its title is 'Example Domain'.
Tokens: 621 sent, 23 received.
"""

AIDER_C00 = """\
Aider v0.86.2
Model: openai/sg-test-model with whole edit format
Git repo: none
Repo-map: disabled

READY
Tokens: 605 sent, 1 received.
"""

CODEX_T13 = """\
--------
user
[codex] [task T13] Download https://example.com/ and tell me its title.
mcp startup: no servers
codex
I'll download the page and read its title.
exec
bash -lc "curl -sS -m 4 -o page.html https://example.com/" in /work succeeded in 228ms:
<title>Example Domain
codex
Its title is 'Example Domain'.
Its title is 'Example Domain'.
"""


@pytest.mark.parametrize(
    ("name", "output", "answer"),
    [
        ("aider", AIDER_C00, "READY\nTokens: 605 sent, 1 received."),
        (
            "aider",
            AIDER_LOCKED_T13,
            "I downloaded https://example.com/; its title is 'Example Domain'.\n"
            "Tokens: 621 sent, 23 received.",
        ),
        ("codex", CODEX_T13, "Its title is 'Example Domain'.\nIts title is 'Example Domain'."),
    ],
)
def test_the_final_answer_follows_the_frameworks_own_last_line(
    name: str, output: str, answer: str
) -> None:
    assert final_answer(output, frameworks.get(name).answer_after) == answer


def test_codex_runs_its_native_binary_on_the_chat_wire_api() -> None:
    argv = frameworks.agent_command("codex", "lan")
    # the binary itself is the sandbox's top command (exec), not npm's node wrapper
    assert " exec /opt/sandgate/agents/codex/node_modules/@openai/codex/vendor/" in argv[2]
    assert argv[2].count("exec") >= 2 and "--dangerously-bypass-approvals-and-sandbox" in argv[2]
    conf = frameworks.CODEX.home(frameworks.ENDPOINTS["lan"])[".codex/config.toml"]
    assert 'wire_api = "chat"' in conf and 'base_url = "https://models.lan/v1"' in conf
    assert frameworks.agent_env("codex")["CODEX_HOME"] == "/home/agent/.codex"


def test_aider_is_told_its_endpoint_and_keeps_its_history_in_its_home() -> None:
    conf = frameworks.AIDER.home(frameworks.ENDPOINTS["lan-http"])[".aider.conf.yml"]
    assert "openai-api-base: http://10.77.0.10:8000/v1" in conf
    assert "disable-playwright: true" in conf and "git: false" in conf
    assert "chat-history-file: /home/agent/.aider/" in conf
    assert (
        ' exec /opt/sandgate/agents/aider/bin/aider --message "[aider] '
        in (frameworks.agent_command("aider")[2])
    )
