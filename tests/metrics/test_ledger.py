"""The sample ledger (fasync.metrics.ledger): every transition keeps it balanced, a wrong count shows, and it
crosses processes as a copy."""

from fasync.metrics.ledger import Ledger


def test_every_transition_keeps_the_ledger_balanced():
    ledger = Ledger()
    ledger.admit(64)
    ledger.drop("zero_variance", 8)  # scored, dropped before it was queued
    ledger.deliver(40)
    ledger.drop("stale", 8)  # from the queue
    ledger.train(taken=24, trained=20)  # 4 trimmed
    assert (ledger.produced, ledger.in_flight, ledger.queued, ledger.consumed) == (64, 16, 8, 20)
    assert ledger.dropped == {"zero_variance": 8, "stale": 8, "trimmed": 4}
    assert ledger.balanced and "balanced" in ledger.balance_sheet()


def test_a_count_gone_negative_or_missing_is_unbalanced():
    ledger = Ledger()
    ledger.admit(4)
    ledger.deliver(4)
    ledger.train(taken=8, trained=8)  # more than was queued
    assert not ledger.balanced and "UNBALANCED" in ledger.balance_sheet()
    assert not Ledger(produced=1).balanced


def test_a_ledger_crosses_to_another_process_as_a_copy():
    import pickle

    ledger = Ledger()
    ledger.admit(4)
    copy = pickle.loads(pickle.dumps(ledger))
    copy.deliver(4)
    assert copy.balanced and (ledger.in_flight, copy.queued) == (4, 4)
