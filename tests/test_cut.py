"""A decode's consistent cut (`Repair.recover_many`, `ectable.client.cut`): what one reply of a node says it had
sent or applied holds only for the slots that reply carried, so a node read again is read again whole.

Found by simulation seed rs 307 (pinned in test_sim.py): a holder re-read for some stripes only (fewer
degraded writes than another holder there) reported newer delta counts, which were then taken for its
other stripes' parity, read a round earlier; data read later matched those counts, and a replacement's
row was decoded from parity and data of different moments (garbage, and parity stale after a flush).
"""
import numpy as np

from ectable.client.cut import inconsistent, lag

K = 2
# stripes x slots (2 data + 2 parity): the node at each slot
NODES = np.array([[0, 1, 2, 3],
                  [0, 1, 3, 2],
                  [2, 3, 0, 1]])
READ = np.ones(NODES.shape, dtype=bool)


def test_a_holder_read_again_for_some_stripes_is_read_again_for_all():
    versions = np.zeros(NODES.shape, dtype=np.int64)
    versions[0, 3] = 1  # holder 3 took a degraded write in stripe 0 that holder 2 has not yet
    again = inconsistent(NODES, READ, set(), set(), K, versions)
    assert again[0, 2]  # holder 2's parity of stripe 0: one degraded write behind
    assert again[1, 3], "holder 2's parity of stripe 1 comes from the reply that is read again"
    assert not again[:, :K].any() and not again[2, K:].any()  # nothing else


def test_a_data_node_ahead_or_a_holder_lagging_is_read_again_whole():
    none = np.zeros(NODES.shape, dtype=np.int64)
    again = inconsistent(NODES, READ, set(), {1}, K, none)
    assert again[0, 1] and again[1, 1] and again.sum() == 2
    again = inconsistent(NODES, READ, {2}, set(), K, none)
    assert again[0, 2] and again[1, 3] and again.sum() == 2


def test_a_holder_replaced_since_the_data_was_read_is_read_again():
    """Found by simulation seed rs 11: a rebuild's read of a holder went out before that holder died and was
    answered late by the dead node (it had taken no delta of the row written meanwhile); the data node read
    later counted no delta to that position (it had learned of the replacement, and deltas to a replacement
    start anew), so the counts agreed and a row was decoded from parity and data of different moments."""
    old, new = "node/3/old", "node/3/new"
    data = {7: ("node/7/a", {"4": 1}, {}, {"3": new, "4": "node/4/b"}, 1)}  # sent 4 one delta; 3 is `new`
    holders = {3: (old, {}), 4: ("node/4/b", {"node/7/a": 1})}
    lagging, ahead = lag(data, holders)
    assert lagging == {3} and ahead == {7}  # both read again until they agree on who holds position 3
    holders[3] = (new, {})
    assert lag(data, holders) == (set(), set())
    data[7] = ("node/7/a", {"4": 1}, {}, {"4": "node/4/b"}, 1)  # a data node that never knew position 3
    assert lag(data, holders) == (set(), set())
