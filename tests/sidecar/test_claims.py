"""The claims table and the leases, shared by real processes: one winner per key however
many claim it at once, counters that lose no update, and a process killed in the middle
(holding the lock, claims, a lease) that blocks nobody and leaves nothing behind."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path

from sidecar.buffer.claims import INVALIDATED, SLOTS, WINDOW, Claims, State
from sidecar.runtime.supervisor import InheritedFd
from sidecar.shared import Shared

KEYS = [f"https://example.test/{n}" for n in range(300)]
PROCESSES = 4
CHARGE = 4096

_context = multiprocessing.get_context("forkserver")


def _shared() -> Shared:
    return Shared.create(PROCESSES, Claims.size(PROCESSES))


def _claim_all(inherited: InheritedFd, me: int, together: Barrier, out: str) -> None:
    """Claim every key, all processes at once; once all are done (a claim committed is
    free again), store those won from the lease (no index)."""
    claims = Claims(Shared(inherited.fd))
    together.wait()
    won = []
    for key in KEYS:
        state, _ = claims.claim(key, me) or (None, None)
        if state == State.FREE:
            won.append(key)
    together.wait()
    for key in won:
        assert claims.take(me, CHARGE) is not None
        assert claims.commit(key, me, CHARGE, lambda: None)
    Path(out).write_text("\n".join(won))


def _hold(inherited: InheritedFd, me: int, ready: Event, lock: bool) -> None:
    """Claim some keys and take some lease; then hold the lock (or not) until killed."""
    shared = Shared(inherited.fd)
    claims = Claims(shared)
    for key in KEYS[:10]:
        claims.claim(key, me)
        claims.take(me, CHARGE)
    if lock:
        with shared.lock:
            ready.set()
            time.sleep(60)
    ready.set()
    time.sleep(60)


def _claim_one(inherited: InheritedFd, key: str, me: int) -> None:
    state, _ = Claims(Shared(inherited.fd)).claim(key, me) or (None, None)
    raise SystemExit(0 if state == State.FREE else 1)


def test_one_process_wins_each_key_and_no_count_is_lost(tmp_path: Path) -> None:
    shared = _shared()
    claims = Claims(shared)
    for me in range(PROCESSES):
        claims.grant(me, len(KEYS) * CHARGE)
    together = _context.Barrier(PROCESSES)
    processes = [
        _context.Process(
            target=_claim_all,
            args=(InheritedFd(shared.fd), me, together, str(tmp_path / f"{me}")),
        )
        for me in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    won = [(tmp_path / f"{me}").read_text().split("\n") for me in range(PROCESSES)]
    everything = [key for keys in won for key in keys if key]
    assert sorted(everything) == sorted(KEYS)  # each key once, by one process
    assert claims.commits == len(KEYS) and claims.running() == 0
    assert claims.fold() == (len(KEYS) * CHARGE, len(KEYS))
    assert sum(claims.lease(me).held for me in range(PROCESSES)) == 0


def test_a_claim_seen_by_others_is_its_owners_until_freed() -> None:
    claims = Claims(_shared())
    key = KEYS[0]
    assert claims.claim(key, 1) == (State.FREE, 1)
    assert claims.claim(key, 2) == (State.RUNNING, 1)
    claims.release(key, 2)  # not its claim: nothing happens
    assert claims.state(key) == State.RUNNING
    assert claims.announce(key, 1, State.FOLLOWED)
    assert claims.claim(key, 2) == (State.FOLLOWED, 1)
    claims.invalidate([key])
    assert claims.state(key) == State.FOLLOWED | INVALIDATED
    committed: list[str] = []
    assert not claims.end(key, 1, lambda: committed.append(key))  # never committed
    assert not committed and claims.state(key) == State.FOLLOWED | INVALIDATED
    assert claims.end(key, 1)  # its fill aborted
    assert claims.state(key) == State.FREE and claims.commits == 0
    assert claims.claim(key, 2) == (State.FREE, 2)
    assert claims.end(key, 2, lambda: committed.append(key))
    assert committed == [key] and claims.commits == 1 and claims.state(key) == State.FREE
    # An invalidated small fill never commits; its owner releases it.
    assert claims.claim(key, 1) == (State.FREE, 1)
    claims.grant(1, CHARGE)
    assert claims.take(1, CHARGE) == 0 and claims.take(1, 1) is None  # 0 left idle
    claims.invalidate([key])
    assert not claims.commit(key, 1, CHARGE, lambda: None)
    claims.release(key, 1, CHARGE)
    assert claims.state(key) == State.FREE and claims.lease(1).idle == CHARGE


def test_a_full_window_of_claims_declines_more_and_a_freed_slot_takes_one_again() -> None:
    claims = Claims(_shared())
    claimed = []
    for n in range(SLOTS + WINDOW):
        if claims.claim(f"k{n}", 0) is None:
            declined = f"k{n}"
            break
        claimed.append(f"k{n}")
    assert len(claimed) >= SLOTS // 2  # a window fills only when the table is well filled
    assert claims.running() == len(claimed)
    for key in claimed:
        claims.release(key, 0)
    assert claims.claim(declined, 0) == (State.FREE, 0) and claims.running() == 1


def test_a_process_killed_holding_the_lock_claims_and_a_lease_blocks_nobody() -> None:
    shared = _shared()
    claims = Claims(shared)
    claims.grant(3, 100 * CHARGE)
    for lock in (True, False):
        ready = _context.Event()
        holder = _context.Process(target=_hold, args=(InheritedFd(shared.fd), 3, ready, lock))
        holder.start()
        assert ready.wait(30)
        if not lock:
            assert claims.claim(KEYS[0], 0) == (State.RUNNING, 3)
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join(10)
        # The kernel released its lock: another process claims what it did not hold.
        other = _context.Process(target=_claim_one, args=(InheritedFd(shared.fd), KEYS[20], 1))
        other.start()
        other.join(10)
        assert other.exitcode == 0
        claims.release(KEYS[20], 1)
        assert claims.state(KEYS[0]) == State.RUNNING  # its claims stay until the keeper...
        assert claims.lease(3).held == 10 * CHARGE
        settled: list[tuple[int, int, int]] = []
        claims.forget(3, lambda *totals, into=settled: into.append(totals))
        # ...frees them, and takes back its lease.
        assert settled == [(100 * CHARGE, 0, 0)]
        assert claims.running() == 0 and claims.lease(3).granted == 0
        assert claims.claim(KEYS[0], 0) == (State.FREE, 0)
        claims.release(KEYS[0], 0)
        claims.grant(3, 100 * CHARGE)
