"""client_app.batch_delivery: a batch's threads take turns running Python (TURN_WAIT_S), and a
message slow before its training never holds the others back longer than that."""

from __future__ import annotations

import threading
import time

from client_app import batch_delivery


class _Counter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


def test_the_batch_threads_run_one_at_a_time():
    running = _Counter()

    def deliver(app, message, context):
        with running:
            time.sleep(0.005)  # releases the GIL, as a torch call does: without turns another thread runs now
        return message

    replies = batch_delivery.deliver_batch(None, [(i, None) for i in range(5)], deliver)
    assert replies == list(range(5))
    assert running.most == 1


def test_a_message_slow_before_training_does_not_hold_the_turn_for_the_others():
    done_at: dict[int, float] = {}
    start = time.monotonic()

    def deliver(app, message, context):
        if message == 0:
            time.sleep(1.0)  # holds its turn: the others go ahead after TURN_WAIT_S each
        done_at[message] = time.monotonic() - start
        return message

    batch_delivery.deliver_batch(None, [(i, None) for i in range(4)], deliver)
    others = [done_at[i] for i in (1, 2, 3)]
    assert max(others) < done_at[0]  # not queued behind the slow message's second
