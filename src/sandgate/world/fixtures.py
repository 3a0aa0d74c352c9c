"""Content for the test world's package index and git server, built when the world comes up.

A real wheel (so ``pip install`` inside a sandbox has something to fetch and install) and a
real bare git repository (so ``git clone https://github.com/octocat/Hello-World`` works).
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "sandgate-hello"
VERSION = "1.0.0"
# What the test world's PyPI serves: its own package, and stand-ins for the two that report
# 000's agent installed (same names and versions; tiny modules, no dependencies).
PACKAGES = ((PACKAGE, VERSION), ("requests", "2.34.2"), ("rich", "15.0.0"))
REPO = ("octocat", "Hello-World")


def build_fixtures(base: Path) -> None:
    wheels = base / "wheels"
    wheels.mkdir(exist_ok=True)
    for package, version in PACKAGES:
        build_wheel(wheels, package, version)
    git = base / "git"
    git.mkdir(exist_ok=True)
    build_repo(git / REPO[0] / f"{REPO[1]}.git")


def build_wheel(folder: Path, package: str = PACKAGE, version: str = VERSION) -> Path:
    module = package.replace("-", "_")
    dist = f"{module}-{version}"
    files = {
        f"{module}/__init__.py": (
            f'__version__ = "{version}"\nGREETING = "hello from the test world"\n'
        ),
        f"{dist}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
            "Summary: a package served by sandgate's test world\n"
        ),
        f"{dist}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: sandgate\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [
        f"{name},sha256={_digest(text.encode())},{len(text.encode())}"
        for name, text in files.items()
    ]
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_repo(bare: Path) -> None:
    bare.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "octocat",
        "GIT_AUTHOR_EMAIL": "octocat@example.com",
        "GIT_COMMITTER_NAME": "octocat",
        "GIT_COMMITTER_EMAIL": "octocat@example.com",
    }
    with tempfile.TemporaryDirectory() as work:

        def git(*args: str, cwd: str = work) -> None:
            subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)

        git("init", "-q", "-b", "master")
        Path(work, "README").write_text("Hello World! (served by sandgate's test world)\n")
        git("add", "README")
        git("commit", "-q", "-m", "first commit")
        git("clone", "-q", "--bare", work, str(bare), cwd="/")
    subprocess.run(
        ["git", "update-server-info"], cwd=bare, env=env, check=True, capture_output=True
    )
