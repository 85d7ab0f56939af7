"""Write leases: at most one writer per run (and per dataset being loaded), enforced in SQL.

A lease is a row in `leases` keyed by resource name ("run:NAME", "dataset:KEY").
Acquiring inserts the row (the primary key makes two inserts race-free on SQLite
and PostgreSQL); a holder refreshes `heartbeat_at` from a background thread and
before every write. A row left by a crashed holder is *stale* and may be taken
over with a compare-and-swap on its token: immediately when its process is gone
on this host, otherwise once its heartbeat is older than the stale period. Works
the same on SQLite and PostgreSQL, across hosts sharing one database (clocks must
agree to within the stale period).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from .errors import BusyError, LeaseLostError
from .schema import Lease, utcnow

STALE_AFTER = timedelta(seconds=float(os.environ.get("ATTNSTORE_LEASE_STALE_SECONDS", 60)))
HEARTBEAT_EVERY = STALE_AFTER.total_seconds() / 6
HOST = socket.gethostname()

# Tokens of leases held by this process: a stale row carrying our own pid is from an
# earlier process that had the same pid, unless its token is one of these.
_HELD: set[str] = set()


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    acquired_at: datetime
    heartbeat_at: datetime
    token: str

    def describe(self) -> str:
        return f"{self.host}/pid {self.pid} since {self.acquired_at:%Y-%m-%d %H:%M:%S} UTC"


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)  # SQLite returns naive UTC


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(holder: Holder, now: datetime | None = None) -> bool:
    """True when the holder is certainly gone (same host, no such process) or silent past the stale period."""
    if holder.host == HOST and holder.token not in _HELD:
        if holder.pid == os.getpid() or not _pid_alive(holder.pid):
            return True
    return (now or utcnow()) - _aware(holder.heartbeat_at) > STALE_AFTER


def current_holder(engine: sa.Engine, resource: str) -> Holder | None:
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(Lease.host, Lease.pid, Lease.acquired_at, Lease.heartbeat_at, Lease.token).where(Lease.resource == resource)
        ).first()
    return None if row is None else Holder(row.host, row.pid, _aware(row.acquired_at), _aware(row.heartbeat_at), row.token)


def live_holder(engine: sa.Engine, resource: str) -> Holder | None:
    """The holder of `resource` if it is alive, else None."""
    holder = current_holder(engine, resource)
    return None if holder is None or is_stale(holder) else holder


def clear_stale(engine: sa.Engine, resource: str) -> bool:
    """Delete `resource`'s row if its holder is gone (compare-and-swap on its token); True if one was deleted.

    For a path that finds the work already done and so never takes the lease: a holder killed
    after committing but before releasing would otherwise leave its row behind for good.
    """
    holder = current_holder(engine, resource)
    if holder is None or not is_stale(holder):
        return False
    with engine.begin() as conn:
        n = conn.execute(sa.delete(Lease).where(Lease.resource == resource, Lease.token == holder.token)).rowcount
    return n == 1


class LeaseCheck:
    """A held lease as a writer checks it: `check()` refreshes its heartbeat and raises LeaseLostError once
    it was taken over. On its own it is how a distributed ingest's workers hold their coordinator's lease
    (`token` passed to them): they check it before every write and never take or release it."""

    def __init__(self, engine: sa.Engine, resource: str, what: str, token: str):
        self.engine = engine
        self.resource = resource
        self.what = what
        self.token = token
        self._lost = False

    def _touch(self, conn) -> bool:
        n = conn.execute(
            sa.update(Lease).where(Lease.resource == self.resource, Lease.token == self.token).values(heartbeat_at=utcnow())
        ).rowcount
        return n == 1

    def check(self, conn=None) -> None:
        """Refresh the heartbeat and make sure the lease is still ours (inside `conn`'s transaction if given)."""
        if not self._lost:
            if conn is not None:
                self._lost = not self._touch(conn)
            else:
                with self.engine.begin() as own:
                    self._lost = not self._touch(own)
        if self._lost:
            raise LeaseLostError(
                f"{self.what}: another process took over this write (this one stalled longer than "
                f"{STALE_AFTER.total_seconds():.0f} s); stopped without writing more"
            )

    def release(self) -> None:
        """Nothing to give back: the lease belongs to whoever took it."""


class WriteLease(LeaseCheck):
    """A lease this process took; use as a context manager. A background thread keeps its heartbeat."""

    def __init__(self, engine: sa.Engine, resource: str, what: str, token: str):
        super().__init__(engine, resource, what, token)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease {resource}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY):
            try:
                with self.engine.begin() as conn:
                    if not self._touch(conn):
                        self._lost = True
                        return
            except Exception:
                pass  # a missed beat is retried; the stale period allows several

    def release(self) -> None:
        self._stop.set()
        _HELD.discard(self.token)
        try:
            with self.engine.begin() as conn:
                conn.execute(sa.delete(Lease).where(Lease.resource == self.resource, Lease.token == self.token))
        except Exception:
            pass  # left behind, the row is stale as soon as this process exits

    def __enter__(self) -> WriteLease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(engine: sa.Engine, resource: str, what: str, *, wait: bool = False, on_wait=None, poll_seconds: float = 0.5) -> WriteLease:
    """Take the lease on `resource` or raise BusyError naming its live holder (with `wait`, poll until free)."""
    token = uuid.uuid4().hex
    # Known as ours before its row exists: another thread of this process that reads the row before `acquire` returns
    # must see a live holder, not a row of this pid it takes for a dead earlier process's.
    _HELD.add(token)
    try:
        return _acquire(engine, resource, what, token, wait, on_wait, poll_seconds)
    except BaseException:
        _HELD.discard(token)
        raise


def _acquire(engine: sa.Engine, resource: str, what: str, token: str, wait: bool, on_wait, poll_seconds: float) -> WriteLease:
    told = False
    while True:
        now = utcnow()
        try:
            with engine.begin() as conn:
                conn.execute(
                    sa.insert(Lease).values(resource=resource, token=token, host=HOST, pid=os.getpid(), acquired_at=now, heartbeat_at=now)
                )
            break
        except IntegrityError:
            pass
        holder = current_holder(engine, resource)
        if holder is not None and is_stale(holder, now):
            with engine.begin() as conn:  # compare-and-swap: only one taker wins
                n = conn.execute(
                    sa.update(Lease)
                    .where(Lease.resource == resource, Lease.token == holder.token)
                    .values(token=token, host=HOST, pid=os.getpid(), acquired_at=now, heartbeat_at=now)
                ).rowcount
            if n == 1:
                break
            continue
        if holder is None:
            continue  # released between our insert and our read: try again
        if not wait:
            raise BusyError(
                f"{what} is being written by {holder.describe()}; wait for it to finish "
                f"(or stop it: a killed writer's run resumes with the same command)"
            )
        if on_wait is not None and not told:
            on_wait(f"waiting: {what} is being written by {holder.describe()}")
            told = True
        time.sleep(poll_seconds)
    return WriteLease(engine, resource, what, token)
