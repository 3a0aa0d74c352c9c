"""`sandgate doctor` on the real test world: every hop passes; a broken hop fails with its fix.

Two breakages, each the way a user meets it: a policy without the model server's exemption
(report 002's first afternoon), and a gateway whose upstream resolver is unreachable (the
SERVFAIL that looks like a DNS problem inside the sandbox).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandgate.doctor.hops import Status
from sandgate.doctor.plan import OFFLINE_ADDRESS, OFFLINE_NAME
from sandgate.doctor.runner import DoctorOptions, doctor_on
from sandgate.events.schema import Kind
from sandgate.session.stack import Stack, bring_up

from .conftest import Runner
from .test_cli import sg

pytestmark = pytest.mark.kernel


@pytest.fixture
def home(store_path: Path) -> Path:
    return store_path.parent


def _doctor(stack: Stack, home: Path, *args: str) -> tuple[int, dict[str, object]]:
    r = sg("doctor", "--world", "test", "--instance", stack.instance, "--json", *args, home=home)
    assert r.stdout.count("\n") == 1, r.stdout + r.stderr  # one object
    return r.returncode, json.loads(r.stdout)


def test_doctor_passes_every_hop_on_the_test_world(stack: Stack, home: Path) -> None:
    code, out = _doctor(stack, home)
    hops = out["hops"]
    assert isinstance(hops, list)
    bad = [h for h in hops if h["status"] == "fail"]
    assert code == 0 and not bad, bad
    names = [h["name"] for h in hops]
    for expected in (
        "sandbox resolver", "gateway resolver", "upstream DNS", "explicit proxy",
        "transparent proxy :80", "model server 10.77.0.10:8000", "inspection api.openai.com",
        "CA wiring: curl", "CA wiring: git", "CA wiring: node", "CA wiring: pip",
        "proxy variables", "clock skew", "uplink",
    ):  # fmt: skip
        assert expected in names, names
    by_name = {h["name"]: h for h in hops}
    # Report 002's lesson: the issuer seen inside tells inspection from a raw tunnel.
    assert "issuer CN=sandgate inspection CA" in by_name["inspection api.openai.com"]["detail"]
    assert "GET /v1/models → 200" in by_name["model server 10.77.0.10:8000"]["detail"]
    assert "NXDOMAIN" in by_name["upstream DNS"]["detail"]  # an uncached name, from upstream
    assert "Date" in by_name["clock skew"]["detail"]
    # The table, for people: the same hops, and the exit status.
    r = sg("doctor", "--world", "test", "--instance", stack.instance, home=home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "inspection api.openai.com" in r.stdout and "0 failed" in r.stdout


def test_a_missing_model_exemption_fails_with_the_rule_to_add(
    stack: Stack, home: Path, tmp_path: Path
) -> None:
    assert stack.world is not None
    text = stack.world.policy.read_text()
    text = re.sub(r'\n  \{ host = "10\.77\.0\.10".*\n', "\n", text)
    text = re.sub(r"\[\[profiles\.agent\.front\]\]\nname = .*\nupstream = .*\n", "", text)
    assert "10.77.0.10" not in text
    policy = tmp_path / "no-model.toml"
    policy.write_text(text)
    code, out = _doctor(stack, home, "--policy", str(policy))
    assert code == 1
    hops = {h["name"]: h for h in out["hops"]}  # type: ignore[union-attr]
    model = hops["model server 10.77.0.10:8000"]
    assert model["status"] == "fail"
    assert model["fix"] == (
        'add { host = "10.77.0.10", port = 8000, name = "model server" } to '
        f"[profiles.agent] allow in {policy}"
    )
    # Only that hop: the rest of the chain still works.
    assert [h["name"] for h in out["hops"] if h["status"] == "fail"] == [  # type: ignore[union-attr]
        "model server 10.77.0.10:8000"
    ]
    r = sg("doctor", "--world", "test", "--instance", stack.instance, "--policy", str(policy),
           home=home)  # fmt: skip
    assert r.returncode == 1 and "fix:" in r.stdout and "10.77.0.10" in r.stdout


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    store = tmp_path_factory.mktemp("doctor") / "events.db"
    stack = bring_up(world=True, store=str(store), extra_env={"SANDGATE_FAULTS": "1"})
    try:
        yield stack
    finally:
        stack.teardown()


def test_an_unreachable_upstream_fails_the_upstream_hop(faulty: Stack) -> None:
    assert faulty.config is not None
    opts = DoctorOptions(world="test", store=str(faulty.config.store))
    before = doctor_on(faulty, opts)
    assert not before.failed, [h for h in before.hops if h.status is Status.FAIL]
    with faulty.gateway.client() as ctl:
        ctl.call("fault", what="upstream")
    after = doctor_on(faulty, opts)
    hops = {h.name: h for h in after.hops}
    upstream = hops["upstream DNS"]
    assert upstream.status is Status.FAIL
    assert "SERVFAIL" in upstream.detail
    # The fix names the upstream the gateway uses (the control socket's snapshot) and the key.
    assert "127.0.0.1" in upstream.fix and "upstream_dns" in upstream.fix
    # The resolver itself still answers: the hop before it passes.
    assert hops["gateway resolver"].status is Status.OK
    assert hops["sandbox resolver"].status is Status.OK


def test_the_offline_door_requests_are_answered_by_the_gateway_itself(sandbox: Runner) -> None:
    """Without a world, doctor asks both doors for sandgate-doctor.invalid (the transparent one
    at TEST-NET-1): the gateway's proxy must refuse it itself, so nothing is forwarded."""
    work = Path(tempfile.mkdtemp(prefix="sg-doctortest-"))
    work.chmod(0o777)
    door = f"{OFFLINE_NAME}:80:{OFFLINE_ADDRESS}"
    url = f"http://{OFFLINE_NAME}/"
    r = sandbox.sh(
        f"curl -sS -m 4 -o /dev/null -D /work/explicit -x $HTTP_PROXY {url}; "
        f"curl -sS -m 4 -o /dev/null -D /work/transparent --noproxy '*' --resolve {door} {url}",
        workdir=work,
    )
    heads = {d: (work / d).read_text().lower() for d in ("explicit", "transparent")}
    shutil.rmtree(work, ignore_errors=True)
    assert r.exit_code == 0
    for door_name, head in heads.items():
        assert "x-sandgate-reason" in head, (door_name, head)
    http = [e for e in sandbox.events(r) if e.kind is Kind.HTTP]
    assert len(http) == 2 and all(e.verdict == "deny" for e in http), http
