"""The version arithmetic of fasync/staleness.py, checked against hand-worked cases."""

import pytest

from fasync import staleness as st


@pytest.mark.parametrize("mode, bound, steps, interval, lag, versions", [
    ("fully_async", 2, 4, 1, 11, 2.75),  # the brief's example: not "5 versions"
    ("async", 1, 1, 1, 1, 1.0),  # N = I = 1: the lag is the bound
    ("async", 1, 1, 2, 3, 1.5),
    ("sync", None, 3, 4, 2, 2 / 3),  # sync: s = 0, I = 1, so N − 1
    ("sync", None, 1, 1, 0, 0.0),
])
def test_max_lag_is_counted_in_optimizer_steps(mode, bound, steps, interval, lag, versions):
    bound_ = st.max_lag(mode, bound, steps, interval)
    assert bound_.steps == lag
    assert bound_.versions == pytest.approx(versions)


def test_unbounded_lag_reads_unbounded():
    lag = st.max_lag("fully_async", None, 2, 1)
    assert lag.steps is None and lag.versions is None and lag.steps_and_versions() == "unbounded"


def test_the_lag_in_words_adds_versions_only_where_a_version_spans_several_steps():
    assert st.max_lag("async", 2, 1, 1).steps_and_versions() == "2 optimizer steps"
    assert st.max_lag("async", 2, 4, 1).steps_and_versions() == "11 optimizer steps (2.75 versions)"
    assert st.max_lag("sync", None, 2, 1).steps_and_versions() == "1 optimizer step (0.5 versions)"


def test_admission_and_staleness_rules():
    # Rollout 5 with a sync every 2 rollouts trains at version 2; engines at version 0 may generate it
    # only under a bound of 2 or more.
    assert st.train_version(5, 2) == 2
    assert st.may_generate(5, 0, 2, 2) and not st.may_generate(5, 0, 2, 1)
    assert st.may_generate(100, 0, 1, None)
    assert st.too_stale(3, 0, 2) and not st.too_stale(2, 0, 2) and not st.too_stale(9, 0, None)


def test_a_group_in_flight_is_stale_if_late_only_at_the_bounds_edge_before_a_sync():
    # Bound 2, drain at version 5 and the next at 6: a group from version 3 (staleness 2 now, 3 next) is lost by
    # finishing late; one from version 4 still fits the next drain; one from version 2 is already too stale.
    assert [st.stale_if_late(5, 6, oldest, 2) for oldest in (2, 3, 4)] == [False, True, False]
    assert not st.stale_if_late(5, 5, 3, 2)  # no sync before the next drain: it fits that one too
    assert not st.stale_if_late(5, 6, 0, None)  # no bound, nothing is ever too stale


@pytest.mark.parametrize("bound, interval", [(0, 1), (1, 1), (2, 3), (4, 2)])
def test_async_runs_ahead_as_far_as_admission_allows(bound, interval):
    # Weights at version 0 may generate exactly the first rollouts_ahead rollouts.
    ahead = st.rollouts_ahead(bound, interval)
    assert all(st.may_generate(r, 0, interval, bound) for r in range(ahead))
    assert not st.may_generate(ahead, 0, interval, bound)
    assert st.rollouts_ahead(None, interval) == 2  # unbounded: a horizon of its own


@pytest.mark.parametrize("bound, interval, drains", [(1, 1, 2), (2, 1, 3), (1, 2, 4), (3, 2, 8), (None, 2, 2)])
def test_the_default_fully_async_queue_holds_every_drain_the_bound_admits(bound, interval, drains):
    from fasync.config.derived import derive
    from fasync.config.schema import FasyncConfig

    cfg = FasyncConfig.model_validate({"mode": "fully_async", "rollout": {"batch_size": 8},
                                       "async": {"max_weight_staleness": bound, "update_weights_interval": interval}})
    # A version spans `interval` drains: at bound 1 and a sync every 2 drains the rollouter may run 4 drains
    # ahead, and a queue of 2 would hold admission (which counts queued and in-flight groups) at half of that.
    assert derive(cfg).max_queue_size == 8 * drains


def test_version_clock_measures_lag_in_steps():
    clock = st.VersionClock()
    # Two optimizer steps per version: version 1 after step 1, version 2 after step 3.
    clock.publish(1, 2)
    clock.publish(2, 4)
    assert clock.lag_steps(4, 2) == 0
    assert clock.lag_steps(5, 1) == 3
    restored = st.VersionClock()
    restored.load_state_dict(clock.state_dict())
    assert restored.lag_steps(5, 1) == 3


@pytest.mark.parametrize("mode, bound, steps, interval, epochs, lag, per_version", [
    ("sync", None, 2, 1, 3, 5, 6),  # sync: N × E − 1, the last step of the last epoch on the rollout's data
    ("sync", None, 1, 1, 2, 1, 2),
    ("fully_async", 1, 1, 1, 2, 3, 2),  # (1 + 1) × 1 × 1 × 2 − 1
    ("async", 2, 4, 1, 2, 23, 8),
    ("fully_async", 0, 2, 3, 2, 11, 12),
])
def test_every_epoch_adds_its_steps_to_the_lag(mode, bound, steps, interval, epochs, lag, per_version):
    bound_ = st.max_lag(mode, bound, steps, interval, epochs)
    assert (bound_.steps, bound_.steps_per_version) == (lag, per_version)
    assert st.max_lag(mode, bound, steps, interval, 1).steps == st.max_lag(mode, bound, steps, interval).steps
