"""Check-N-Run's checkpoint policies as pure decisions: the kind of the next checkpoint, the chain a restore
reads, what can be deleted; checked against a model of a table's rows written between checkpoints."""
import pytest
from hypothesis import example, given, strategies as st

import numpy as np

from ectable.checkpoint.policy import Policy, Taken, deletable, next_differential, next_kind, restore_chain
from ectable.errors import InvalidRequest


def _kinds(policy, rows):
    taken = []
    for n, r in enumerate(rows):
        kind = next_kind(policy, taken)
        taken.append(Taken(n, kind, 1000 if kind == "full" else r, 1000))
    return [t.kind for t in taken]


def test_each_policy_chooses_its_kinds():
    rows = [100, 200, 300, 400, 450, 100, 200]
    assert _kinds(Policy("full"), rows) == ["full"] * 7
    assert _kinds(Policy("incremental"), rows) == ["full"] + ["incremental"] * 6
    assert _kinds(Policy("differential"), rows) == ["full"] + ["differential"] * 6
    # differentials of 200, 300, 400 rows of 1,000: after 400 (grown by 100) the next is estimated at 500,
    # half a full one: a new baseline instead
    assert _kinds(Policy("intermittent", 0.5), rows) == ["full", "differential", "differential", "differential",
                                                          "full", "differential", "differential"]


def test_one_differential_is_not_taken_to_grow_by_itself():
    """After a differential of 280 rows of 1,000, the next is estimated at 2 * 280 - 280^2 / 1000 = 481.6 (rows
    touched again are not new), under the threshold of 500; 300 rows would give 510, over it."""
    assert next_differential([Taken(0, "full", 1000, 1000), Taken(1, "differential", 280, 1000)]) == pytest.approx(481.6)
    assert _kinds(Policy("intermittent", 0.5), [0, 280, 400]) == ["full", "differential", "differential"]
    assert _kinds(Policy("intermittent", 0.5), [0, 300, 400]) == ["full", "differential", "full"]


@given(st.lists(st.floats(0, 1), min_size=1, max_size=50), st.integers(1, 6))
@example([0.3] * 10, 1)
def test_the_estimate_is_at_least_the_expected_differential(chances, taken):
    """Rows touched in each interval with chance p_i (the same every interval): after k intervals a differential
    is expected to hold sum(1 - (1 - p)^k) rows; the estimate from the ones before is never below that."""
    p = np.array(chances)
    expected = [float((1 - (1 - p) ** k).sum()) for k in range(1, taken + 2)]
    history = [Taken(0, "full", p.size, p.size)] + [Taken(k, "differential", e, p.size)
                                                    for k, e in enumerate(expected[:-1], 1)]
    assert next_differential(history) >= expected[-1] - 1e-9
    if taken == 1 and np.ptp(p) == 0:  # every row as likely: the estimate is the expectation itself
        assert next_differential(history) == pytest.approx(expected[-1])


def test_restore_chains():
    t = [Taken(0, "full", 9, 9), Taken(1, "incremental", 2, 9), Taken(2, "differential", 3, 9),
         Taken(3, "incremental", 1, 9), Taken(4, "full", 9, 9), Taken(5, "differential", 4, 9)]
    numbers = lambda chain: [c.number for c in chain]  # noqa: E731
    assert numbers(restore_chain(t, 1)) == [0, 1]
    assert numbers(restore_chain(t, 2)) == [0, 2]  # a differential holds everything since its baseline
    assert numbers(restore_chain(t, 3)) == [0, 2, 3]
    assert numbers(restore_chain(t)) == [4, 5]
    assert [c.number for c in deletable(t, keep=1)] == [0, 1, 2, 3]
    assert [c.number for c in deletable(t, keep=3)] == [1]  # 3 needs 0 and 2, not 1
    with pytest.raises(InvalidRequest, match="no checkpoint 7"):
        restore_chain(t, 7)
    with pytest.raises(InvalidRequest, match="no full checkpoint before it"):
        restore_chain([Taken(3, "incremental", 1, 9)])
    with pytest.raises(InvalidRequest, match="keep at least one"):
        deletable(t, keep=0)


@pytest.mark.parametrize("config, match", [("weekly", "must be one of"), ({"name": "full", "every": 3}, "a name or"),
                                           ({"name": "intermittent", "threshold": 0}, r"share in \(0, 1\]"),
                                           ({"name": "intermittent", "threshold": True}, "share"), (7, "a name or")])
def test_bad_policies_are_refused(config, match):
    with pytest.raises(InvalidRequest, match=match):
        Policy.from_config(config)


def test_a_policy_config_round_trips():
    policy = Policy.from_config({"name": "intermittent", "threshold": 0.3})
    assert Policy.from_config(policy.get_config()) == policy and Policy.from_config("full") == Policy("full")


@given(st.lists(st.tuples(st.sets(st.integers(0, 30), max_size=12),
                          st.sampled_from(["full", "incremental", "differential", None])), min_size=1, max_size=12),
       st.sampled_from(["full", "incremental", "differential", "intermittent"]), st.integers(1, 4))
def test_a_restore_reads_back_every_checkpoint_exactly(steps, name, keep):
    """Rows written between checkpoints (a version per write); each checkpoint writes what its kind names
    (chosen by the policy, or forced); restoring any checkpoint from its chain gives the rows as they were,
    and deleting what `deletable` names leaves the last `keep` restorable."""
    policy, rows, since_last, since_full = Policy(name, 0.4), {}, set(), set()
    taken, written, states = [], {}, {}
    for n, (writes, forced) in enumerate(steps):
        for row in writes:
            rows[row] = (n, row)
        since_last |= writes
        since_full |= writes
        kind = forced if forced and taken else next_kind(policy, taken)
        part = set(rows) if kind == "full" else since_last if kind == "incremental" else since_full
        written[n] = {row: rows[row] for row in part}
        taken.append(Taken(n, kind, len(part), len(rows)))
        states[n] = dict(rows)
        since_last = set()
        if kind == "full":
            since_full = set()
    for t in taken:
        restored = {}
        for c in restore_chain(taken, t.number):
            restored.update(written[c.number])
        assert restored == states[t.number], (t, [c.number for c in restore_chain(taken, t.number)])
    gone = {t.number for t in deletable(taken, keep)}
    for t in taken[-keep:]:
        assert not gone & {c.number for c in restore_chain(taken, t.number)}
