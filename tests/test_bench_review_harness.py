"""The benchmark harness: the repeats fill ``--budget``, whatever the warm-up (JIT compilation) cost."""

import time

from hpcgpu.bench.harness import measure


def _compiled_once(first_s, then_s):
    calls = []

    def call():
        time.sleep(first_s if not calls else then_s)
        calls.append(1)

    return call


def test_a_slow_first_call_does_not_cut_the_repeats_the_budget_allows():
    # the first call compiles (0.5 s); the kernel then takes 2 ms: a budget of 1 s holds hundreds of them,
    # so the cap of 20 applies (sized from the warm-up, it was 1 // 0.5 -> 2)
    durations = measure(_compiled_once(0.5, 0.002), synchronize=lambda: None, budget_s=1.0, min_repeats=2,
                        max_repeats=20)
    assert len(durations) == 20 and max(durations) < 0.5


def test_the_repeats_stay_within_the_budget_and_its_limits():
    durations = measure(_compiled_once(0.02, 0.02), synchronize=lambda: None, budget_s=0.1, min_repeats=2)
    assert 2 <= len(durations) <= 5 and sum(durations) < 0.1 + 0.1
    slow = measure(_compiled_once(0.05, 0.05), synchronize=lambda: None, budget_s=0.01, min_repeats=3)
    assert len(slow) == 3
    fixed = measure(_compiled_once(0.3, 0.001), synchronize=lambda: None, repeats=7, budget_s=0.0)
    assert len(fixed) == 7
