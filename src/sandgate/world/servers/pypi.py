"""A PEP 503 "simple" package index over a directory of wheels and sdists.

Routes (on the vhost whose config has `"pypi": "/dir"`):

* `/simple/` lists projects; `/simple/<project>/` lists its files as
  `<a href="/files/<file>#sha256=<hex>">`; a name that is not normalized (PEP 503) is
  redirected to the normalized one, and a missing trailing slash is added by redirect.
* `/files/<file>` serves the file.

The directory is re-read on each request, so a test can drop a wheel in and use it.
"""

from __future__ import annotations

import hashlib
import html
import re
from pathlib import Path

from sandgate.world.servers.httpio import Request, Response, text_response
from sandgate.world.servers.static import file_response

__all__ = ["handle_index", "normalize", "project_of"]

_SDIST_SUFFIXES = (".tar.gz", ".zip", ".tar.bz2")
_HASHES: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_of(filename: str) -> str | None:
    """The normalized project a distribution file belongs to, or None for other files."""
    if filename.endswith(".whl"):
        parts = filename[: -len(".whl")].split("-")
        return normalize(parts[0]) if len(parts) >= 5 else None
    for suffix in _SDIST_SUFFIXES:
        if filename.endswith(suffix):
            name, sep, _version = filename[: -len(suffix)].rpartition("-")
            return normalize(name) if sep and name else None
    return None


def _sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        _HASHES[key] = digest.hexdigest()
    return _HASHES[key]


def scan(directory: Path) -> dict[str, list[Path]]:
    projects: dict[str, list[Path]] = {}
    for path in sorted(directory.iterdir()):
        project = project_of(path.name)
        if project is not None and path.is_file():
            projects.setdefault(project, []).append(path)
    return projects


def _page(title: str, links: list[tuple[str, str]]) -> Response:
    anchors = "\n".join(
        f'    <a href="{html.escape(href)}">{html.escape(text)}</a><br/>' for href, text in links
    )
    body = (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n"
        f"    <h1>{html.escape(title)}</h1>\n{anchors}\n  </body>\n</html>\n"
    )
    return text_response(200, body, "text/html; charset=utf-8")


def _redirect(location: str) -> Response:
    return Response(301, [("location", location)], b"")


async def handle_index(req: Request, directory: Path) -> Response | None:
    """Answer `/simple/...` and `/files/...`; None for other paths."""
    path = req.path
    if path == "/simple":
        return _redirect("/simple/")
    if path == "/simple/":
        names = sorted(scan(directory))
        return _page("Simple index", [(f"/simple/{n}/", n) for n in names])
    if m := re.fullmatch(r"/simple/([^/]+)(/?)", path):
        wanted, slash = m.group(1), m.group(2)
        if normalize(wanted) != wanted or not slash:
            return _redirect(f"/simple/{normalize(wanted)}/")
        files = scan(directory).get(wanted)
        if not files:
            return text_response(404, f"no project {wanted}\n")
        links = [(f"/files/{f.name}#sha256={_sha256(f)}", f.name) for f in files]
        return _page(f"Links for {wanted}", links)
    if m := re.fullmatch(r"/files/([^/]+)", path):
        target = directory / m.group(1)
        if project_of(target.name) is None or not target.is_file():
            return text_response(404, "no such file\n")
        return file_response(target, "application/octet-stream")
    return None
