"""RestartBudget: at most N engine-core restarts within a window; older ones age out."""

from services.instance.engine_restart import RestartBudget


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_refuses_one_restart_too_many_within_the_window():
    clock = FakeClock()
    budget = RestartBudget(max_restarts=2, window_s=60.0, clock=clock)
    assert budget.try_take() and budget.try_take()
    clock.now = 59.0
    assert not budget.try_take()
    assert budget.num_recent == 2


def test_restarts_older_than_the_window_age_out():
    clock = FakeClock()
    budget = RestartBudget(max_restarts=1, window_s=60.0, clock=clock)
    assert budget.try_take()
    clock.now = 60.5
    assert budget.try_take()
    assert not budget.try_take()


def test_a_zero_budget_never_restarts():
    assert not RestartBudget(max_restarts=0, window_s=60.0).try_take()
