"""Threads and asyncio: the GIL is released while a task is submitted and
waited for, many threads submit at once, and a Task is awaitable (a future
the cache's waiter thread completes: no polling)."""
import asyncio
import threading

import numpy as np
import pytest

import ucmcache
from conftest import SHARD, base_config, keys_of, pattern

HUNG = 777  # sim store: loads of block 777, shard 0 hang until the store goes


def sim_cache(comm, **over):
    spec = "sim:latency_us=50,gbps=0,hang_keys=%d.0,fail_keys=888.1" % HUNG
    return ucmcache.Cache(comm, **base_config(spec, **{"timeout_ms": 5000, **over}))


def hung_key():
    return (ucmcache.block_id(HUNG), 0)


def test_many_threads_submit_at_once(comm, cache):
    r = comm.Get_rank()
    keys = [keys_of(200 + 10 * r + t, 4) for t in range(8)]
    for ks in keys:
        cache.dump(ks, [pattern(k) for k in ks]).wait()
    errors = []

    def worker(ks):
        try:
            out = np.zeros((len(ks), SHARD), np.uint8)
            for _ in range(10):
                out[:] = 0
                cache.load(ks, out).wait()
                for i, k in enumerate(ks):
                    assert np.array_equal(out[i], pattern(k))
        except Exception as e:  # reported below, on this rank
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(ks,)) for ks in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads) and errors == []


def test_other_threads_run_while_one_waits(comm):
    c = sim_cache(comm)
    t = c.load([hung_key()], np.zeros(SHARD, np.uint8))  # never completes by itself
    with pytest.raises(ucmcache.UcmTimeoutError, match="still running"):
        t.wait(timeout=0.05)
    assert not t.test()  # a timed-out task stays valid
    entered, outcome = threading.Event(), []

    def waiter():
        entered.set()
        try:
            t.wait()
        except ucmcache.UcmError as e:
            outcome.append(e)

    w = threading.Thread(target=waiter)
    w.start()
    entered.wait(30)
    # Python code runs here while the waiter sits in an unbounded wait on a
    # task that cannot finish: it holds no GIL. Nothing ends the wait but close.
    ran = sum(i for i in range(100000))
    other = threading.Thread(target=lambda: outcome.append("other thread ran"))
    other.start()
    other.join(30)
    assert ran > 0 and outcome == ["other thread ran"] and w.is_alive()
    comm.Barrier()
    c.close()  # ends the wait: ClosedError
    w.join(60)
    assert not w.is_alive()
    assert isinstance(outcome[1], ucmcache.ClosedError)


def test_asyncio_waits(comm, cache):
    r = comm.Get_rank()
    groups = [keys_of(300 + 10 * r + g, 3) for g in range(6)]

    async def main():
        await asyncio.gather(*(cache.dump(ks, [pattern(k) for k in ks]) for ks in groups))
        outs = [np.zeros((3, SHARD), np.uint8) for _ in groups]
        ticks = []

        async def ticker():  # the loop keeps running while tasks are awaited
            for i in range(3):
                ticks.append(i)
                await asyncio.sleep(0)

        await asyncio.gather(ticker(), *(cache.load(ks, o) for ks, o in zip(groups, outs)))
        return outs, ticks

    outs, ticks = asyncio.run(main())
    assert ticks == [0, 1, 2]
    for ks, o in zip(groups, outs):
        for i, k in enumerate(ks):
            assert np.array_equal(o[i], pattern(k))


def test_asyncio_failure_and_close(comm):
    c = sim_cache(comm)
    bad = (ucmcache.block_id(888), 1)
    good = (ucmcache.block_id(889), 1)

    async def failing():
        with pytest.raises(ucmcache.BackendError) as e:
            await c.load([good, bad], np.zeros((2, SHARD), np.uint8))
        return e.value

    e = asyncio.run(failing())
    assert e.keys == [bad] and e.indexes == [1] and e.result == ucmcache.errors.ERR_BACKEND

    async def hung():
        t = c.load([hung_key()], np.zeros(SHARD, np.uint8))
        done, pending = await asyncio.wait([asyncio.ensure_future(_await(t))], timeout=0.05)
        assert not done  # the loop ran on while the task hangs
        return t, pending.pop()

    async def _await(t):
        await t

    loop = asyncio.new_event_loop()
    try:
        t, fut = loop.run_until_complete(hung())
        comm.Barrier()
        c.close()  # the waiter thread's wait ends: the await raises ClosedError
        with pytest.raises(ucmcache.ClosedError):
            loop.run_until_complete(asyncio.wait_for(fut, 60))
    finally:
        loop.close()


def test_sync_wait_reports_backend_keys(comm):
    with sim_cache(comm) as c:
        keys = [(ucmcache.block_id(900 + i), 1) for i in range(3)] + [(ucmcache.block_id(888), 1)]
        with pytest.raises(ucmcache.BackendError) as e:
            c.load(keys, np.zeros((4, SHARD), np.uint8)).wait()
        assert e.value.keys == [keys[3]] and e.value.indexes == [3]
        assert "888" in str(e.value) or "0000000000000378" in str(e.value)
        comm.Barrier()


def test_a_task_that_fails_by_its_deadline_is_its_outcome_not_a_wait_timeout(comm):
    # ucm_task_wait says UCM_ERR_TIMEOUT both when its own bound runs out (the
    # task runs on) and when the task's result is its deadline (timeout_ms,
    # the handle retired). Bounded waits of a hung load, again and again, must
    # end with the task's own failure naming the key, not "still running" and
    # then UnknownTaskError (the outcome lost).
    with sim_cache(comm, timeout_ms=1000) as c:
        t = c.load([hung_key()], np.zeros(SHARD, np.uint8))
        for _ in range(200):  # at most 40 s: the task ends after 1
            with pytest.raises(ucmcache.UcmTimeoutError) as e:
                t.wait(0.2)
            if "still running" not in str(e.value):
                break
        assert "deadline" in str(e.value) and "%032x" % HUNG in str(e.value), str(e.value)
        assert t.done
        with pytest.raises(ucmcache.UnknownTaskError, match="already waited"):
            t.wait(0.2)
        comm.Barrier()


def test_a_lookup_the_store_holds_times_out_with_what_it_answered(comm):
    # The store holds exists() of the hung key 1.5 s (a stuck NFS mount);
    # ucm_lookup gives up at timeout_ms (1 s) with the keys before it
    # answered. The TimeoutError carries those answers, as a BackendError
    # does: the call's where, and the unanswered keys and their indexes. (The
    # store returns before close's own deadline, a timeout_ms after it begins.)
    spec = "sim:latency_us=0,hang_keys=%d.0,hang_sync=1,hang_ms=1500" % HUNG
    with ucmcache.Cache(comm, **base_config(spec, timeout_ms=1000)) as c:
        keys = [(ucmcache.block_id(901), 0), hung_key(), (ucmcache.block_id(902), 0)]
        with pytest.raises(ucmcache.UcmTimeoutError, match="timeout_ms 1000") as e:
            c.lookup(keys)
        assert list(e.value.where) == [ucmcache.WHERE_BACKEND, ucmcache.WHERE_ERROR, ucmcache.WHERE_ERROR]
        assert e.value.keys == keys[1:] and e.value.indexes == [1, 2]
        comm.Barrier()
