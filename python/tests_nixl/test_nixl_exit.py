"""Nothing native outlives a NIXL peer's interpreter: a producer that exits while its consumer still
holds the control connection, and then the consumer, print none of nanobind's leak lines."""

import time

from conftest import config
from test_nixl_pull import pull, store


def leak_lines(peer, settle_s=2.0):
    """nanobind's leak lines on the exited peer's stderr (read by its drain thread: the lines
    come at the very end of the process, so they are waited for a moment)."""
    deadline = time.monotonic() + settle_s
    while True:
        lines = [line for line in peer.stderr if "nanobind: leaked" in line]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def test_a_producer_exiting_with_its_consumer_connected_leaks_nothing_native(peers):
    producer, consumer = peers(("producer", config(64)), ("consumer", config(64)))
    store(producer)
    assert pull(consumer, producer)["equal"]
    producer.close()  # the consumer's control connection is still open: a serve thread blocked
    assert producer.proc.returncode == 0, "".join(producer.stderr[-30:])
    assert leak_lines(producer) == [], "".join(producer.stderr[-30:])
    consumer.close()
    assert consumer.proc.returncode == 0, "".join(consumer.stderr[-30:])
    assert leak_lines(consumer) == [], "".join(consumer.stderr[-30:])
