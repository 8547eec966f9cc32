"""`fasync.bench.timing.timed_method`: the time of every call inside the block, the method restored after it."""

from fasync.bench.timing import timed_method


class Engine:
    def __init__(self):
        self.calls = []

    def prefill(self, tokens):
        self.calls.append(tokens)
        return len(tokens)


def test_every_call_in_the_block_adds_its_clock_time_and_the_method_is_restored():
    engine = Engine()
    ticks = iter([10.0, 12.5, 20.0, 21.0])  # two calls: 2.5 s and 1.0 s by this clock
    with timed_method(engine, "prefill", clock=lambda: next(ticks)) as spent:
        assert engine.prefill("ab") == 2
        assert spent == [2.5]
        assert engine.prefill("abc") == 3
    assert spent == [3.5]
    assert engine.calls == ["ab", "abc"]  # the method itself ran, with its arguments
    assert "prefill" not in vars(engine)  # the class's method again, untimed
    assert engine.prefill("x") == 1 and spent == [3.5]


def test_a_call_that_raises_is_timed_too():
    class Failing:
        def load(self):
            raise ValueError("bad weights")

    owner = Failing()
    ticks = iter([0.0, 4.0])
    with timed_method(owner, "load", clock=lambda: next(ticks)) as spent:
        try:
            owner.load()
        except ValueError:
            pass
    assert spent == [4.0]
