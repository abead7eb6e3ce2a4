"""The node's deadlines (kvserver.server.expiry): overdue waiters fail, done ones are
dropped, and the heap stays about as large as the waiters still pending."""

import asyncio

import pytest

from kvserver.server.expiry import Expired, Expiry


async def test_overdue_waiters_fail_and_others_wait():
    loop = asyncio.get_running_loop()
    expiry = Expiry()
    early, late, answered = (loop.create_future() for _ in range(3))
    expiry.add(10.0, late)
    expiry.add(5.0, early)
    expiry.add(1.0, answered)
    answered.set_result("ok")
    assert expiry.expire(4.9) == 0  # the answered one's deadline passed: dropped, not failed
    assert not early.done() and not late.done()
    assert expiry.expire(5.0) == 1
    with pytest.raises(Expired):
        early.result()
    assert not late.done() and len(expiry) == 1
    assert expiry.expire(100.0) == 1 and len(expiry) == 0


async def test_the_heap_holds_about_the_pending_waiters():
    loop = asyncio.get_running_loop()
    expiry = Expiry()
    pending = []
    for i in range(20_000):
        fut = loop.create_future()
        expiry.add(1e9 + i, fut)
        if i % 100 == 0:
            pending.append(fut)
        else:
            fut.set_result(None)  # answered long before its deadline
    assert len(expiry) <= 2 * len(pending) + 1024
    assert expiry.expire(2e9) == len(pending)
    assert all(isinstance(f.exception(), Expired) for f in pending)
