"""The sandbox's drift snapshot read with os calls equals the pathlib reading it replaced
(issue 13: the fast path is judged against the slow one, kept here), file by file: absent,
a directory in a file's place, a file in a directory's place, past MAX_TEXT, not UTF-8,
hidden, symlinked, dangling."""

from __future__ import annotations

import socket
from pathlib import Path

from sandgate.session import drift


def _read_slow(path: Path) -> str | None:
    try:
        data = path.read_bytes()[: drift.MAX_TEXT]
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"<unreadable: {exc.strerror}>"
    return data.decode("utf-8", "replace")


def _snapshot_slow(home: Path, etc: Path, system_root: Path) -> dict[str, str | None]:
    snap: dict[str, str | None] = {
        "/etc/resolv.conf": _read_slow(etc / "resolv.conf"),
        "/etc/hosts": _read_slow(etc / "hosts"),
    }
    for rel in drift.HOME_FILES:
        snap[f"/home/agent/{rel}"] = _read_slow(home / rel)
    for path in drift.SYSTEM_FILES:
        snap[path] = _read_slow(system_root / path.lstrip("/"))
    for folder in drift.SYSTEM_DIRS:
        directory = system_root / folder.lstrip("/")
        for item in sorted(directory.glob("*")) if directory.is_dir() else []:
            if item.is_file():
                snap[f"{folder}/{item.name}"] = _read_slow(item)
    return snap


def _tree(tmp: Path) -> tuple[Path, Path, Path]:
    home, etc, root = tmp / "home", tmp / "etc", tmp / "root"
    for d in (home, etc, root / "etc" / "apt" / "apt.conf.d", root / "etc" / "profile.d"):
        d.mkdir(parents=True)
    (etc / "resolv.conf").write_text("nameserver 10.201.0.1\n")
    (etc / "hosts").mkdir()  # a directory where a file is read
    (home / ".gitconfig").write_bytes(b"[url]\n\xff\xfe not utf-8\n")
    (home / ".config").write_text("a file where a folder is")  # .config/git/config: ENOTDIR
    (home / ".npmrc").write_bytes(b"x" * (drift.MAX_TEXT + 4097))
    (home / ".curlrc").symlink_to(home / ".gitconfig")
    (home / ".wgetrc").symlink_to(home / "nowhere")
    (root / "etc" / "pip.conf").write_text("[global]\nindex-url = http://evil/\n")
    (root / "etc" / "environment").write_text("")
    confd = root / "etc" / "apt" / "apt.conf.d"
    for name in ("99proxy", "01a", ".hidden", "Zed", "10-b"):
        (confd / name).write_text(f"// {name}\n")
    (confd / "sub").mkdir()
    (confd / "link").symlink_to(confd / "01a")
    (confd / "dangling").symlink_to(confd / "gone")
    (confd / "dirlink").symlink_to(confd / "sub")
    (root / "etc" / "apt" / "sources.list.d").write_text("a file where a folder is")
    (root / "etc" / "profile.d" / "big.sh").write_bytes(b"\xc3" * (drift.MAX_TEXT + 1))
    return home, etc, root


def test_the_snapshot_read_with_os_calls_equals_the_pathlib_reading(tmp_path: Path) -> None:
    home, etc, root = _tree(tmp_path)
    fast = drift.sandbox_snapshot(home, etc, root)
    assert fast == _snapshot_slow(home, etc, root)
    assert list(fast) == list(_snapshot_slow(home, etc, root))  # the labels in the same order
    # The cases are there (a tree that lost them would compare equal and prove nothing).
    assert fast["/etc/hosts"] == "<unreadable: Is a directory>"
    assert fast["/home/agent/.config/git/config"] is None
    assert len(fast["/home/agent/.npmrc"] or "") == drift.MAX_TEXT
    assert "/etc/apt/apt.conf.d/.hidden" in fast and "/etc/apt/apt.conf.d/sub" not in fast
    assert fast["/home/agent/.wgetrc"] is None and fast["/etc/wgetrc"] is None


def test_the_hosts_own_system_files_read_the_same(tmp_path: Path) -> None:
    home, etc = tmp_path / "home", tmp_path / "etc"
    home.mkdir()
    etc.mkdir()
    assert drift.sandbox_snapshot(home, etc) == _snapshot_slow(home, etc, Path("/"))


def test_a_file_that_cannot_be_opened_is_a_note_both_ways(tmp_path: Path) -> None:
    # A unix socket refuses to open (ENXIO), even for root.
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        note = "<unreadable: No such device or address>"
        assert drift.read_text(path) == _read_slow(path) == note
