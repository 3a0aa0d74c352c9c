"""Copying fixtures and homes into a sandbox: links never lead back out; changes are found."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandgate.errors import SandboxError
from sandgate.sandbox.tree import compare, copy_tree, manifest, mirror_changes

UID = os.getuid()


def _tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("hello\n")
    (root / "sub" / "b.txt").write_text("b\n")


def test_inside_links_are_recreated_relative_and_stay_inside_the_copy(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    dst.mkdir()
    os.symlink("../a.txt", src / "sub" / "rel")
    # An absolute link into the template itself: copied as-is it would lead back into the
    # shared template (report 000's tools/ link). It must point into the copy instead.
    os.symlink(str(src / "sub"), src / "abs")
    copy_tree(src, dst, UID)
    assert os.readlink(dst / "sub" / "rel") == "../a.txt"
    assert not os.readlink(dst / "abs").startswith("/")
    assert (dst / "abs").resolve() == (dst / "sub").resolve()
    (dst / "abs" / "new.txt").write_text("x")
    assert not (src / "sub" / "new.txt").exists()


def test_a_link_outside_is_refused_with_the_fix(tmp_path: Path) -> None:
    src, dst, shared = tmp_path / "src", tmp_path / "dst", tmp_path / "shared"
    _tree(src)
    shared.mkdir()
    dst.mkdir()
    os.symlink(str(shared), src / "tools")
    with pytest.raises(SandboxError) as err:
        copy_tree(src, dst, UID)
    assert "tools" in err.value.message and "outside" in err.value.message
    assert err.value.fix is not None and "--copy-links" in err.value.fix


def test_copy_links_copies_what_an_outside_link_points_to(tmp_path: Path) -> None:
    src, dst, shared = tmp_path / "src", tmp_path / "dst", tmp_path / "shared"
    _tree(src)
    (shared / "lib").mkdir(parents=True)
    (shared / "lib" / "x.py").write_text("x = 1\n")
    dst.mkdir()
    os.symlink(str(shared), src / "tools")
    notes = copy_tree(src, dst, UID, copy_links=True)
    assert not (dst / "tools").is_symlink()
    assert (dst / "tools" / "lib" / "x.py").read_text() == "x = 1\n"
    (dst / "tools" / "lib" / "y.py").write_text("escape?")
    assert not (shared / "lib" / "y.py").exists()
    assert any("tools" in n for n in notes)


def test_setuid_bits_are_dropped(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src)
    os.chmod(src / "a.txt", 0o4755)
    dst.mkdir()
    copy_tree(src, dst, UID)
    assert (dst / "a.txt").stat().st_mode & 0o7000 == 0


def test_compare_finds_new_changed_and_deleted_even_with_the_same_size(tmp_path: Path) -> None:
    _tree(tmp_path)
    before = manifest(tmp_path)
    (tmp_path / "a.txt").write_text("HELLO\n")  # same size, other content
    (tmp_path / "sub" / "b.txt").unlink()
    (tmp_path / "c.txt").write_text("new")
    changes = {c.path: c.change for c in compare(before, manifest(tmp_path))}
    assert changes == {"a.txt": "changed", "sub/b.txt": "deleted", "c.txt": "new"}


def test_mirror_changes_writes_back(tmp_path: Path) -> None:
    live, template = tmp_path / "live", tmp_path / "template"
    _tree(live)
    _tree(template)
    before = manifest(live)
    (live / "a.txt").write_text("changed\n")
    (live / "sub" / "b.txt").unlink()
    (live / "n" / "m").mkdir(parents=True)
    (live / "n" / "m" / "f").write_text("f")
    mirror_changes(compare(before, manifest(live)), live, template)
    assert (template / "a.txt").read_text() == "changed\n"
    assert not (template / "sub" / "b.txt").exists()
    assert (template / "n" / "m" / "f").read_text() == "f"
