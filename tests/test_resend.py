"""A request lost on the way is sent again while its sender waits (`transport.Resends`), on ZeroMQ and in
the simulation alike; a reply to a copy already answered is dropped.

Found by simulation seeds xor 177, rs 695 and xor 289 (pinned in test_sim.py): a degraded write's delta
lost once was sent again only at the request's 30 s deadline, after the holder's promise to take it had
run out, so the write was split between the holders that took it and a replacement that took it again.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq

from ectable.testing.sim.network import Faults, Network, SimChannel
from ectable.testing.sim.world import World
from ectable.transport import RESEND_AFTER, Resends, ZmqChannel, codec
from ectable.transport.base import RESEND_RATE
from ectable.transport.zeromq import bind_to, make_socket


def test_resends_come_after_a_second_then_twice_as_long_each_time():
    resends = Resends(0.0)
    due = [t / 10 for t in range(0, 400) if resends.due(t / 10)]
    assert due == [RESEND_AFTER, 3.0, 7.0, 15.0, 23.0, 31.0, 39.0]


def test_a_big_request_is_given_the_time_its_bytes_take_before_it_goes_out_again():
    """A node's state handed over (hundreds of MB) is not sent again while it still crosses: its first resend
    waits a second more per RESEND_RATE bytes, and the next ones never come sooner than that."""
    frames = [b"header", np.zeros(int(3 * RESEND_RATE) - 6, dtype=np.uint8)]  # 3 s worth in all
    resends = Resends(0.0, frames)
    due = [t / 10 for t in range(0, 400) if resends.due(t / 10)]
    assert due == [RESEND_AFTER + 3.0, 12.0, 20.0, 28.0, 36.0]
    small = Resends(0.0, [b"header", np.zeros(100, dtype=np.uint8)])  # a request's few bytes change nothing
    assert [t / 10 for t in range(0, 400) if small.due(t / 10)] == [RESEND_AFTER, 3.0, 7.0, 15.0, 23.0, 31.0, 39.0]


class _Forgetful:
    """A simulated host that loses the first `forget` requests it gets."""

    alive = True

    def __init__(self, forget: int):
        self.forget, self.seen = forget, 0

    def receive(self, frames):
        self.seen += 1
        if self.seen <= self.forget:
            return None
        header, _ = codec.decode(frames)
        return codec.encode({"id": header["id"], "echo": header["op"]}, [])


@pytest.mark.parametrize("forget", [2, 4])  # every message arrives twice: the first send, and the first resend
def test_a_simulated_request_lost_on_the_way_is_answered_after_it_is_sent_again(forget):
    world = World(5)
    network = Network(world, Faults(duplicate=1.0))  # every reply arrives twice
    host = network.hosts["tcp://127.0.0.1:1"] = _Forgetful(forget)
    channel = SimChannel(network, "client", "tcp://127.0.0.1:1")
    with world.acting("main"):
        reply, _ = channel.call({"op": "ping"}, [], 30.0)
        assert reply["echo"] == "ping"
        assert world.now < 3.5, "answered only at the deadline: the request was not sent again"
        assert host.seen >= forget + 1
        reply, _ = channel.call({"op": "status"}, [], 30.0)  # the late copy of the first reply is not taken
        assert reply["echo"] == "status"
        world.sleep(1.0)
    world.close()
    assert not channel._replies


@pytest.mark.parametrize("reconnect", [False, True], ids=["same-connection", "after-a-reconnect"])
def test_a_zeromq_request_lost_on_the_way_is_answered_after_it_is_sent_again(reconnect):
    """`reconnect`: the connection is made afresh while the request waits (as after a failed handshake):
    the request is sent again on the new one, and its reply taken."""
    context = zmq.Context()
    router = make_socket(context, zmq.ROUTER)
    endpoint = bind_to(router, "tcp://127.0.0.1:0")
    stop = threading.Event()
    seen = []

    def node():  # drops the first request it gets, answers every later one twice
        while not stop.is_set():
            if router.poll(50):
                peer, *frames = router.recv_multipart()
                header, _ = codec.decode(frames)
                seen.append(header["op"])
                if len(seen) > 1:
                    for _ in range(2):
                        router.send_multipart([peer, *codec.encode({"id": header["id"], "echo": header["op"]}, [])])
    thread = threading.Thread(target=node, daemon=True)
    thread.start()
    channel = ZmqChannel(endpoint, context)
    try:
        pending = channel.start({"op": "ping"}, [])
        if reconnect:
            channel._reset()
        reply, _ = pending.wait(10.0)  # NodeDown after 10 s if it were not sent again, or its reply dropped
        assert reply["echo"] == "ping" and seen[:2] == ["ping", "ping"]
        reply, _ = channel.call({"op": "status"}, [], 10.0)
        assert reply["echo"] == "status"
        assert not channel._replies and not channel._waiting  # the second copies were dropped
    finally:
        stop.set()
        thread.join(5)
        channel.close()
        router.close(0)
        context.term()
