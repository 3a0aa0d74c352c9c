"""Git smart HTTP by running `git http-backend` as a CGI program (read-only).

A vhost with `"git": "/srv/git"` serves the bare repository `/srv/git/<owner>/<repo>.git`
at `https://host/<owner>/<repo>.git` and, like GitHub, also at `https://host/<owner>/<repo>`.
Pushes stay disabled: http-backend only enables receive-pack for an authenticated
REMOTE_USER, and we never set one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

from sandgate.world.servers.httpio import Request, Response, text_response
from sandgate.world.servers.runtime import JsonLog, format_addr

__all__ = ["git_path_info", "handle_git"]

_GIT_PATH = re.compile(
    r"^/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?"
    r"(/(?:info/refs|git-upload-pack|git-receive-pack|HEAD|objects/.+))$"
)


def git_path_info(path: str) -> str | None:
    """The CGI PATH_INFO (`/<owner>/<repo>.git/<rest>`) for a git request path, else None."""
    m = _GIT_PATH.match(path)
    if m is None or ".." in path:
        return None
    owner, repo, rest = m.groups()
    return f"/{owner}/{repo}.git{rest}"


def _cgi_env(req: Request, root: Path, path_info: str, body_len: int) -> dict[str, str]:
    query = req.target.partition("?")[2]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GATEWAY_INTERFACE": "CGI/1.1",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REQUEST_METHOD": req.method,
        "PATH_INFO": path_info,
        "QUERY_STRING": query,
        "REMOTE_ADDR": req.conn.peer[0],
        "CONTENT_LENGTH": str(body_len),
        "CONTENT_TYPE": req.header("content-type") or "",
        "GIT_PROJECT_ROOT": str(root),
        "GIT_HTTP_EXPORT_ALL": "1",
        # no system or user config may change what we serve; repositories made by
        # another uid (a test's tmp dir) must still be served
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
        "HOME": str(root),
    }
    for name, value in req.headers:
        if name not in ("content-type", "content-length"):
            env["HTTP_" + name.upper().replace("-", "_")] = value
    return env


async def _parse_cgi_head(stdout: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]]]:
    # CGI (RFC 3875) response head: "Name: value" lines up to an empty line; "Status"
    # carries the HTTP status, everything else becomes a response header
    status, headers = 200, []
    while line := (await stdout.readline()).rstrip(b"\r\n"):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "status":
            status = int(value.strip().split()[0])
        else:
            headers.append((name.strip().lower(), value.strip()))
    return status, headers


async def handle_git(req: Request, root: Path, log: JsonLog) -> Response | None:
    path_info = git_path_info(req.path)
    if path_info is None:
        return None
    body = await req.body()
    proc = await asyncio.create_subprocess_exec(
        "git",
        "http-backend",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_cgi_env(req, root, path_info, len(body)),
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def feed() -> None:
        # written concurrently with reading stdout: a big request must not deadlock us
        assert proc.stdin is not None
        with contextlib.suppress(ConnectionError):
            proc.stdin.write(body)
            await proc.stdin.drain()
            proc.stdin.close()

    feeder = asyncio.create_task(feed())
    stderr_task = asyncio.create_task(proc.stderr.read(64 * 1024))
    try:
        status, headers = await _parse_cgi_head(proc.stdout)
    except (ValueError, IndexError):
        proc.kill()
        await proc.wait()
        return text_response(502, "git http-backend sent a bad CGI head\n")

    async def stream() -> AsyncIterator[bytes]:
        assert proc.stdout is not None
        try:
            while chunk := await proc.stdout.read(256 * 1024):
                yield chunk
            await feeder
            code = await proc.wait()
            errors = await stderr_task
            if code or errors:
                log.write(
                    "git_backend",
                    src=format_addr(req.conn.peer),
                    path=path_info,
                    exit=code,
                    stderr=errors.decode(errors="replace"),
                )
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()

    return Response(status, headers, stream(), log={"git": path_info})
