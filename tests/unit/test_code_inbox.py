"""run_code's inbox (runtime/session._Inbox): what an interpreter sent, bounded; the
sender waits past the bound until the cell's thread takes some, or the inbox closes."""

import queue
import threading

import pytest

from corral.runtime.session import _Inbox


def test_a_sender_past_the_bound_waits_until_some_is_taken():
    box = _Inbox(100)
    box.put("a", 60)
    box.put("b", 30)                         # 90: under the bound, at once
    done = threading.Event()

    def send():
        box.put("c", 30)                     # 120 > 100: waits
        done.set()

    t = threading.Thread(target=send, daemon=True)
    t.start()
    assert not done.wait(0.3)                # still waiting: nothing was taken
    assert box.get(1) == "a"                 # 30 left: room now
    assert done.wait(10)
    assert [box.get(1), box.get(1)] == ["b", "c"]
    with pytest.raises(queue.Empty):
        box.get(0.05)


def test_one_item_bigger_than_the_bound_still_goes_in_and_close_never_waits():
    box = _Inbox(10)
    box.put("big", 1000)                     # alone: never waits (else it never could)
    done = threading.Event()
    t = threading.Thread(target=lambda: (box.put("more", 5), done.set()), daemon=True)
    t.start()
    assert not done.wait(0.3)
    box.close(("dead", "why"))               # the last item; waiting senders go on
    assert done.wait(10)
    assert box.get(1) == "big"
