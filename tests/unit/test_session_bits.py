"""Small pure parts of sessions: agent templates, final answers, drift diffs, sudo log."""

from __future__ import annotations

import pytest

from sandgate.agents.registry import PROMPT_FILE, parse_template, resolve
from sandgate.errors import SandgateError
from sandgate.sandbox.privilege import parse_log
from sandgate.session.drift import diff, gateway_snapshot
from sandgate.session.runner import final_answer


def test_templates_fill_placeholders_with_sandbox_paths() -> None:
    argv = parse_template("my-agent --task {prompt_file} --cwd {workdir} --home={home}")
    assert argv == ("my-agent", "--task", PROMPT_FILE, "--cwd", "/work", "--home=/home/agent")


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("agent {prompt}", "unknown placeholder {prompt}"),
        ("agent {prompt_file", "brace"),
        ("agent 'unclosed", "quotes"),
        ("scriptd", "unknown agent"),
        ("", "empty"),
    ],
)
def test_bad_templates_are_refused_before_anything_runs(template: str, needle: str) -> None:
    with pytest.raises(SandgateError) as err:
        parse_template(template)
    assert needle in f"{err.value.message} {err.value.fix}"


def test_the_scripted_agent_is_built_in() -> None:
    spec = resolve("scripted")
    assert spec.argv[-1] == PROMPT_FILE
    assert all(p.is_file() for p in spec.files.values())


def test_final_answer_is_after_the_last_marker() -> None:
    out = "ANSWER: not this\n$ curl\nANSWER: I downloaded it.\nIt has a title.\n"
    assert final_answer(out) == "I downloaded it.\nIt has a title."
    assert final_answer("no marker at all\n") == "no marker at all"


def test_drift_diff_labels_added_removed_changed() -> None:
    before = {"/etc/hosts": "a\n", "/home/agent/.gitconfig": None, "x": "1\n"}
    after = {"/etc/hosts": "a\nb\n", "/home/agent/.gitconfig": "[http]\nproxy=x\n", "x": None}
    items = {i.what: i for i in diff(before, after)}
    assert items["/etc/hosts"].change == "changed" and "+b" in items["/etc/hosts"].diff
    assert items["/home/agent/.gitconfig"].change == "added"
    assert items["x"].change == "removed"
    assert diff(before, before) == []


def test_gateway_snapshot_is_marked_as_gateway() -> None:
    snap = gateway_snapshot({"ruleset": ["r1", "r2"], "resolver": {"cut": False}})
    items = diff(snap, {**snap, "gateway ruleset": "r1\n"})
    assert items[0].gateway and "-r2" in items[0].diff


def test_privilege_log_parses_and_ignores_garbage() -> None:
    log = "1700000000\tsudo\tapt-get install -y jq\nforged line\n1700000001\tsu\t\n"
    attempts = parse_log(log)
    assert [a["tool"] for a in attempts] == ["sudo", "su"]
    assert attempts[0]["args"] == "apt-get install -y jq"


def test_session_ids_made_in_one_second_do_not_collide() -> None:
    """Parallel sessions start within the same second: 2,000 ids, none twice (16 random bits
    gave ~30 collisions here; 32 give one in ~2,000 runs of this test)."""
    from sandgate.session.runner import new_session_id

    ids = [new_session_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
