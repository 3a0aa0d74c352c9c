#!/usr/bin/env bash
# sandgate set-up for Debian 12, as root. Idempotent: installs only what is missing.
#
#   ./setup.sh            install (apt packages, a venv with pinned Python deps, /usr/local/bin/sandgate)
#   ./setup.sh demo       install, then run `sandgate demo`
#   ./setup.sh test       install, then run the whole test suite (lint, types, tests)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${SANDGATE_VENV:-/opt/sandgate/venv}"

if [ "$(id -u)" != 0 ]; then
    echo "setup.sh: run as root (sandgate creates network namespaces and nftables rules)" >&2
    exit 1
fi

# Kernel plumbing, the sandbox, and the real clients tests run inside sandboxes.
packages=(nftables bubblewrap iproute2 util-linux procps curl git ca-certificates
          passt iptables python3 python3-venv python3-pip python3-dev gcc dnsutils iputils-ping
          netcat-openbsd jq sqlite3)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup.sh: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's own Python (not a pyenv or conda one): the sandbox must be able to run it.
if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$(dirname "$venv")"
    /usr/bin/python3 -m venv "$venv"
fi
chmod 755 "$(dirname "$venv")"
stamp="$venv/.sandgate-installed"
want="$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1) $here"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$venv/bin/pip" install -q --disable-pip-version-check -e "$here[test]"
    echo "$want" > "$stamp"
fi
ln -sf "$venv/bin/sandgate" /usr/local/bin/sandgate

case "${1:-}" in
    "") ;;
    demo) shift; exec "$venv/bin/sandgate" demo "$@" ;;
    test)
        shift
        # Only the tests need a browser (the HTML report and the dashboard are checked in one)
        # and dnsperf (a burst of questions from inside a sandbox, test_pool).
        testpkgs=()
        for p in chromium chromium-driver dnsperf; do
            dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || testpkgs+=("$p")
        done
        if [ "${#testpkgs[@]}" -gt 0 ]; then
            echo "setup.sh: installing ${testpkgs[*]} for the tests (a headless browser, a DNS load generator)"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends "${testpkgs[@]}" >/dev/null
        fi
        # A real model for the test world (--world-model smollm2; its tests skip without it):
        # llama.cpp built from source once (several minutes), never in `./setup.sh demo`
        # (outside the tests, `--world-model smollm2` builds it on first use, saying so).
        # The agent frameworks (their tests), each in its own venv under /opt/sandgate/agents,
        # outside every sandbox's writable area; idempotent (a lock stamp). Outside the tests
        # `sandgate suite --agent NAME` installs one on first use, saying so.
        # Hermes Agent: ~1.5 min once with an empty pip cache (2026-12-02).
        # mini-swe-agent: ~2 min once.
        if [ "${SANDGATE_NO_AGENTS:-}" != 1 ]; then
            "$venv/bin/python" -m sandgate.agents.frameworks install hermes >/dev/null ||
                echo "setup.sh: hermes-agent could not be installed; its tests will be skipped" >&2
            "$venv/bin/python" -m sandgate.agents.frameworks install mini-swe-agent >/dev/null ||
                echo "setup.sh: mini-swe-agent could not be installed; its test will be skipped" >&2
            # aider (its test): ~3 min once from the index, ~40 s from pip's cache
            "$venv/bin/python" -m sandgate.agents.frameworks install aider >/dev/null ||
                echo "setup.sh: aider could not be installed; its test will be skipped" >&2
            # OpenAI's Codex CLI (its test): npm, one package with its native binary, ~15 s
            "$venv/bin/python" -m sandgate.agents.frameworks install codex >/dev/null ||
                echo "setup.sh: codex could not be installed; its test will be skipped" >&2
        fi
        if [ "${SANDGATE_NO_MODEL:-}" != 1 ]; then
            "$venv/bin/python" -m sandgate.world.llm install smollm2 >/dev/null ||
                echo "setup.sh: the smollm2 world model could not be installed; its tests will be skipped" >&2
        fi
        # VM guests (issue 9): QEMU, and the built-in guest (a Debian kernel + busybox
        # initramfs under /opt/sandgate/vm, built once; `sandgate run --vm` builds it on first use);
        # qemu-utils and genisoimage for `--vm --image` (its overlay and NoCloud seed).
        vmpkgs=()
        for p in qemu-system-x86 qemu-utils genisoimage busybox-static cpio; do
            dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || vmpkgs+=("$p")
        done
        if [ "${#vmpkgs[@]}" -gt 0 ]; then
            echo "setup.sh: installing ${vmpkgs[*]} for VM guests"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            apt-get install -y -qq --no-install-recommends "${vmpkgs[@]}" >/dev/null
        fi
        "$venv/bin/python" -m sandgate.vm.image
        cd "$here"
        "$venv/bin/ruff" check src tests bench fuzz
        "$venv/bin/mypy"
        exec "$venv/bin/pytest" -q "$@"
        ;;
    *) echo "setup.sh: unknown action '$1' (use: demo, test)" >&2; exit 2 ;;
esac
