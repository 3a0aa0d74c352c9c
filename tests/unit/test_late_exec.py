"""The command line of a sandbox set up before the gateway answers (issue 13): bwrap runs
sandgate-enter --late, and the command with its environment follows as one blob."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.sandbox import bwrap, enter

SPEC = bwrap.SandboxSpec(
    netns="/run/netns/sg-x",
    uid=61000,
    gid=61000,
    command=("sh", "-c", "echo hi"),
    workdir=Path("/tmp/w"),
    home=Path("/tmp/h"),
    env={"HTTP_PROXY": "http://10.0.0.1:3128"},
)


def test_set_up_ahead_bwrap_gets_no_environment_and_runs_the_waiter() -> None:
    late = enter.late_command(7, 9)
    assert late == ["/proc/self/fd/7", "--late", "9", "7"]
    argv = bwrap.bwrap_argv(SPEC, late=late)
    assert "--setenv" not in argv and "--clearenv" in argv
    assert argv[argv.index("--") + 1 :] == late
    # Everything else is the sandbox as it always was: the same namespaces and mounts.
    plain = bwrap.bwrap_argv(SPEC)
    strip = plain[: plain.index("--")]
    setenv = [i for i, a in enumerate(strip) if a == "--setenv"]
    for i in reversed(setenv):
        del strip[i : i + 3]
    assert argv[: argv.index("--")] == strip


def test_the_blob_is_environment_then_an_empty_string_then_the_command() -> None:
    blob = enter.late_blob({"A": "1", "PATH": "/usr/bin"}, ["sh", "", "x y"])
    assert blob == b"A=1\0PATH=/usr/bin\0\0sh\0\0x y\0"
    assert enter.late_blob({}, ["true"]) == b"\0true\0"


@pytest.mark.parametrize(
    ("env", "command"),
    [
        ({"A=B": "1"}, ["true"]),
        ({"": "1"}, ["true"]),
        ({"A": "1\0B=2"}, ["true"]),
        ({"A": "1"}, ["tr\0ue"]),
        ({"A": "1"}, []),
    ],
)
def test_what_cannot_be_sent_is_refused(env: dict[str, str], command: list[str]) -> None:
    with pytest.raises(ValueError):
        enter.late_blob(env, command)
