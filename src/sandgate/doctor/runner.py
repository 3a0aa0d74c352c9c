"""``sandgate doctor``: a fresh guest walks every hop; the judge says which one is broken.

The honest place to test from is inside: a throwaway sandbox of the profile runs the driver
(driver.py) with the plan (plan.py) the profile allows, as ``sandgate prove`` does. The
gateway's own facts (its upstream resolvers, whether it forwards, whether it cut its guests
off) come from the control socket's ``snapshot``; judge.py turns both into hops.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sandgate.doctor.hops import Hop, Status
from sandgate.doctor.judge import GatewayFacts, failed, judge
from sandgate.doctor.plan import Plan, WorldFacts, plan_for
from sandgate.errors import SandgateError
from sandgate.policy.load import load_policy
from sandgate.sandbox.launch import SYSTEM_BUNDLE, ca_env, preflight, proxy_env
from sandgate.session.runner import RunOptions, run_in, signals_raise
from sandgate.session.stack import Stack, stack_for

DRIVER_TARGET = "/run/sandgate/doctor-driver.py"
PLAN_TARGET = "/run/sandgate/doctor-plan.json"
SEEN = "doctor-seen.json"


@dataclass
class DoctorOptions:
    world: str | None = None
    policy: str | None = None
    profile: str | None = None
    instance: str | None = None
    store: str | None = None


@dataclass
class DoctorResult:
    session: str
    profile: str
    mode: str
    policy: str | None
    hops: list[Hop] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return failed(self.hops)

    def totals(self) -> dict[str, int]:
        return {str(s): sum(h.status is s for h in self.hops) for s in Status}

    def as_json(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "profile": self.profile,
            "mode": self.mode,
            "policy": self.policy,
            "ok": not self.failed,
            "hops": [h.as_json() for h in self.hops],
        }


def doctor(opts: DoctorOptions) -> DoctorResult:
    preflight()
    if opts.policy is not None or opts.world is None:
        load_policy(opts.policy)  # a broken policy file stops here, before anything is built
    with signals_raise(), stack_for(opts.world, opts.instance, opts.store, opts.policy) as stack:
        return doctor_on(stack, opts)


def world_facts() -> WorldFacts:
    """The test world's model server and public web hosts (``--world test`` only)."""
    from sandgate.world import topology

    return WorldFacts(model=(topology.MODEL, topology.MODEL_PORT), names=tuple(topology.HOSTS))


def doctor_on(stack: Stack, opts: DoctorOptions) -> DoctorResult:
    world = stack.world
    policy_path = opts.policy or stack.policy or (str(world.policy) if world else None)
    work = Path(tempfile.mkdtemp(prefix="sg-doctor-", dir="/var/tmp"))
    work.chmod(0o777)
    held: dict[str, Any] = {}

    def plan_file(guest: dict[str, Any]) -> dict[str, Path]:
        import ipaddress

        profile = load_policy(policy_path).profile(
            opts.profile,
            public_override=tuple(ipaddress.ip_network(n) for n in world.public_override)
            if world
            else (),
            gateway_address=ipaddress.ip_address(guest["gateway"]),
            guest_pool=ipaddress.ip_network(guest["guest_pool"]),
            host_addresses=tuple(ipaddress.ip_address(a) for a in guest.get("host_addresses", ())),
        )
        plan = plan_for(
            profile,
            guest,
            world_facts() if world else None,
            secrets.token_hex(4),
            ca_env(),
            proxy_env(guest["proxy"]),
            str(SYSTEM_BUNDLE),
        )
        held["plan"] = plan
        path = work / "plan.json"
        path.write_text(json.dumps(plan.as_driver()))
        held["start"] = time.time()  # the sandbox starts now: the driver reads its clock after
        return {PLAN_TARGET: path}

    try:
        run = run_in(
            stack,
            RunOptions(
                command=["/usr/bin/python3", DRIVER_TARGET, PLAN_TARGET, f"/work/{SEEN}"],
                policy=policy_path,
                profile=opts.profile,
                world="test" if world else None,
                workdir=work,
                timeout=120,
                store=opts.store,
                files={DRIVER_TARGET: _driver_path()},
                late_files=plan_file,
                label="doctor",
                capture=False,
                echo=False,
            ),
        )
        end = time.time()
        seen_path = work / SEEN
        if "plan" not in held or not seen_path.exists():
            raise SandgateError(
                f"the doctor's driver did not report (exit {run.exit_code})"
                + (f": {run.report.message}" if run.report.message else ""),
                f"every attempt it made: sandgate log --session {run.session}",
            )
        seen = json.loads(seen_path.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with stack.gateway.client() as ctl:
        snap = ctl.call("snapshot")
    plan: Plan = held["plan"]
    resolver = snap.get("resolver") or {}
    facts = GatewayFacts(
        upstream=tuple(str(s) for s in resolver.get("upstream", ())),
        forwarding=bool(snap.get("forwarding", True)),
        resolver_cut=bool(resolver.get("cut")),
        proxy_cut=bool((snap.get("proxy") or {}).get("cut")),
        host_start=held["start"],
        host_end=end,
        session=run.session,
        policy=policy_path,
    )
    return DoctorResult(
        run.session,
        run.report.profile or plan.profile,
        run.report.mode or "",
        policy_path,
        judge(plan, seen, facts),
    )


def _driver_path() -> Path:
    return Path(str(resources.files("sandgate.doctor").joinpath("driver.py")))
