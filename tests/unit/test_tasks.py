"""Task files: every mistake named with its line before anything runs; checks evaluated."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandgate.session.tasks import (
    CheckSpec,
    TaskFileError,
    evaluate,
    load_tasks,
    outcome,
    parse_tasks,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "report-000.toml"


def _parse(tmp_path: Path, text: str) -> object:
    path = tmp_path / "tasks.toml"
    path.write_text(text)
    return parse_tasks(text.encode(), path)


def test_the_report_000_suite_loads_with_21_tasks() -> None:
    suite = load_tasks(EXAMPLE)
    ids = [t.id for t in suite.tasks]
    assert ids[0] == "C00" and len(ids) == 21
    assert ids[1:11] == [f"H{i:02d}" for i in range(1, 11)]
    assert ids[11:] == [f"T{i}" for i in range(11, 21)]
    assert all(t.modes == ("locked", "open") for t in suite.tasks)
    for t in suite.tasks:
        assert t.checks, f"{t.id} has no check"
        if t.fixtures is not None:
            assert t.fixtures.is_dir()


def test_unknown_key_names_line_and_suggests(tmp_path: Path) -> None:
    text = '[[task]]\nid = "A"\nprompt = "p"\nfixture = "x"\n'
    with pytest.raises(TaskFileError) as err:
        _parse(tmp_path, text)
    (p,) = err.value.problems
    assert p.line == 4 and "fixture" in p.message
    assert p.fix is not None and "fixtures" in p.fix


def test_missing_fixture_folder_is_an_error_with_its_line(tmp_path: Path) -> None:
    text = '[[task]]\nid = "A"\nprompt = "p"\nfixtures = "nope"\n'
    with pytest.raises(TaskFileError) as err:
        _parse(tmp_path, text)
    (p,) = err.value.problems
    assert p.line == 4 and "nope" in p.message and "does not exist" in p.message


def test_several_mistakes_are_all_reported_in_file_order(tmp_path: Path) -> None:
    text = (
        '[suite]\nmodes = ["locked", "shut"]\n\n'
        '[[task]]\nid = "A"\nprompt = "p"\ncheck = [{ answer = "(" }]\n\n'
        '[[task]]\nid = "has space"\nprompt = "q"\n'
    )
    with pytest.raises(TaskFileError) as err:
        _parse(tmp_path, text)
    lines = [p.line for p in err.value.problems]
    assert lines == sorted(lines) and len(lines) == 3
    text_all = str(err.value)
    assert "shut" in text_all and "regular expression" in text_all and "has space" in text_all


def test_duplicate_ids_and_bad_check_shapes(tmp_path: Path) -> None:
    text = (
        '[[task]]\nid = "A"\nprompt = "p"\n'
        '[[task]]\nid = "A"\nprompt = "q"\n'
        'check = [{ answer = "x", file = "y" }]\n'
    )
    with pytest.raises(TaskFileError) as err:
        _parse(tmp_path, text)
    messages = " / ".join(p.message for p in err.value.problems)
    assert "exactly one of answer, output or file" in messages


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError) as err:
        _parse(tmp_path, '[[task]]\nid = "A"\nprompt = "unclosed\n')
    assert err.value.problems[0].line == 3


def test_a_check_file_must_stay_inside_the_work_dir(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="inside the work dir"):
        CheckSpec(file="../etc/passwd")


def test_evaluate_and_outcome(tmp_path: Path) -> None:
    (tmp_path / "out.json").write_text('{"name": "Ada"}')
    checks = [
        CheckSpec(answer=r"\bREADY\b"),
        CheckSpec(file="out.json", pattern='"name": "Ada"'),
        CheckSpec(file="missing.txt"),
        CheckSpec(output="secret", absent=True),
    ]
    results = [evaluate(c, "READY", "all fine", tmp_path) for c in checks]
    assert [r.passed for r in results] == [True, True, False, True]
    assert "missing.txt" in results[2].detail
    assert outcome(results) == "partial"
    assert outcome(results[:2]) == "pass"
    assert outcome(results[2:3]) == "fail"


def test_a_symlinked_result_file_does_not_count(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("Ada")
    (tmp_path / "out.txt").symlink_to(tmp_path / "real")
    assert not evaluate(CheckSpec(file="out.txt", pattern="Ada"), "", "", tmp_path).passed
