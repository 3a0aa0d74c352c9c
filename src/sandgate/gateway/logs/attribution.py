"""Joining who sent a flow (the guest side) with what the gateway did with it.

The gateway sees addresses but not users. Each guest's own namespace logs every new outbound
flow with the sending uid (report 000's ``flags skuid``); the gateway logs its verdicts and the
resolver its questions. Both sides name a flow by the same 5-tuple (the guest's address is not
yet translated when the gateway logs), so an event waiting for its uid is held briefly until
the guest side's record arrives, then emitted once.

Flows the guest started that the gateway never reported (its drop log was rate-limited) are
still emitted, with the verdict ``decide()`` gives for them and ``inferred`` in the details.

Pure apart from the ``emit``/``infer`` callbacks; time is passed in, so tests drive it.
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from sandgate.events.schema import Event, FlowKey


@dataclass
class _Pending:
    event: Event
    due: float


@dataclass
class _Sender:
    uid: int | None
    ts: float
    used: bool = False
    extra: dict[str, object] = field(default_factory=dict)


class Attributor:
    def __init__(
        self,
        emit: Callable[[Event], None],
        infer: Callable[[FlowKey, int | None, float], Event | None] | None = None,
        grace: float = 0.4,
        keep: float = 30.0,
    ) -> None:
        self._emit = emit
        self._infer = infer
        self.grace = grace
        self.keep = keep
        self._senders: dict[FlowKey, _Sender] = {}
        self._pending: dict[tuple[FlowKey, str | None, str | None], _Pending] = {}
        self.attributed = 0
        self.unattributed = 0
        # Called first by tick() and flush(): producers that fold repeats (the resolver's
        # cached answers) submit what they counted, so it is attributed and stored with the rest.
        self.before: list[Callable[[], None]] = []

    @property
    def waiting(self) -> int:
        """Events held for their sender (the attribution queue's depth)."""
        return len(self._pending)

    def sender(self, key: FlowKey, uid: int | None, ts: float, **extra: object) -> None:
        """The guest side saw a new flow ``key`` sent by ``uid``."""
        known = self._senders.get(key)
        if known is None:
            self._senders[key] = _Sender(uid, ts, extra=dict(extra))
        else:
            # Two guest-side records of one flow (the uid log and the process hold): merge.
            known.ts = ts
            known.extra.update(extra)
            if known.uid is None:
                known.uid = uid
        for pkey in [k for k in self._pending if k[0] == key]:
            self._release(pkey, uid)

    def submit(self, key: FlowKey, event: Event, now: float) -> None:
        """A gateway-side event about flow ``key``; emitted once its sender is known."""
        sender = self._senders.get(key)
        if sender is not None:
            sender.used = True
            self._count(sender.uid)
            self._emit(_with(event, sender))
            return
        pkey = (key, event.reason, event.verdict)
        held = self._pending.get(pkey)
        if held is not None:
            held.event = dataclasses.replace(held.event, count=held.event.count + event.count)
            return
        self._pending[pkey] = _Pending(event, now + self.grace)

    def tick(self, now: float) -> None:
        """Emit what waited too long (without a uid) and forget old senders."""
        self._before()
        for pkey, held in list(self._pending.items()):
            if held.due <= now:
                del self._pending[pkey]
                self.unattributed += 1
                self._emit(held.event)
        for key, sender in list(self._senders.items()):
            if now - sender.ts > self.grace and not sender.used and self._infer is not None:
                sender.used = True
                inferred = self._infer(key, sender.uid, sender.ts)
                if inferred is not None:
                    self._count(sender.uid)
                    self._emit(_with(inferred, sender))
            if now - sender.ts > self.keep:
                del self._senders[key]

    def flush(self, guest: str, now: float) -> None:
        """Emit everything held for ``guest`` now (the guest is leaving)."""
        self._before()
        for pkey, held in list(self._pending.items()):
            if pkey[0][0] == guest:
                del self._pending[pkey]
                self.unattributed += 1
                self._emit(held.event)
        for key, sender in list(self._senders.items()):
            if key[0] == guest:
                if not sender.used and self._infer is not None:
                    inferred = self._infer(key, sender.uid, sender.ts)
                    if inferred is not None:
                        self._count(sender.uid)
                        self._emit(_with(inferred, sender))
                del self._senders[key]

    def unreported(self, guest: str) -> list[FlowKey]:
        """Flows ``guest``'s side saw start that no gateway-side event has claimed yet."""
        return [k for k, s in self._senders.items() if k[0] == guest and not s.used]

    def _before(self) -> None:
        for hook in self.before:
            try:
                hook()
            except Exception:  # a producer's bug must not stop the rounds (nor the ticker)
                traceback.print_exc(file=sys.stderr)

    def _release(self, pkey: tuple[FlowKey, str | None, str | None], uid: int | None) -> None:
        held = self._pending.pop(pkey)
        sender = self._senders[pkey[0]]
        sender.used = True
        self._count(uid)
        self._emit(_with(held.event, sender))

    def _count(self, uid: int | None) -> None:
        if uid is None:
            self.unattributed += 1
        else:
            self.attributed += 1


def _with(event: Event, sender: _Sender) -> Event:
    details = {**event.details, **sender.extra} if sender.extra else event.details
    process = sender.extra.get("process")
    pid = process.get("pid") if isinstance(process, dict) else None
    pid = pid if isinstance(pid, int) else event.pid
    return event.but(uid=sender.uid, details=details, pid=pid)
