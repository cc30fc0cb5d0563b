"""The load of `make bench-autoscale`: a rate ramp (low -> high -> low) of random-token
prompts, as arrival times plus prompts, the same for every configuration (fixed seed)."""

import random

from services.bench.datasets import BenchPrompt
from services.simulator.workload import SimRequest, rate_curve_arrivals


def ramp_rate(low: float, high: float, duration_s: float):
    """low -> high over the first third, high for the second, back to low over the last."""
    third = duration_s / 3

    def rate_at(t: float) -> float:
        if t < third:
            return low + (high - low) * t / third
        if t < 2 * third:
            return high
        return high - (high - low) * min(1.0, (t - 2 * third) / third)
    return rate_at


def ramp_workload(low: float, high: float, duration_s: float, prompt_range: tuple[int, int],
                  output_range: tuple[int, int], token_ids: list[int], seed: int = 0):
    """(arrival offsets, prompts, the same requests for the simulator)."""
    rng = random.Random(seed)
    arrivals = rate_curve_arrivals(rng, ramp_rate(low, high, duration_s), high, duration_s)
    prompts, sim_requests = [], []
    for index, arrival in enumerate(arrivals):
        prompt_len, output_len = rng.randint(*prompt_range), rng.randint(*output_range)
        prompts.append(BenchPrompt([rng.choice(token_ids) for _ in range(prompt_len)], output_len))
        sim_requests.append(SimRequest(index, arrival, prompt_len, output_len, None, 0))
    return arrivals, prompts, sim_requests
