"""How many instances a pool needs for a load, from the profile (DistServe / Dynamo SLA
planner style: prefill sized by throughput at the TTFT SLO, decode by the batch an
instance can run within the ITL SLO).

Prefill: a prompt costs S = prefill_s(prompt, cached) seconds of one instance. With each
instance an M/D/1 queue at utilization rho, TTFT = S + rho * S / (2 (1 - rho)), which stays
within the SLO while rho <= 2h / (S + 2h), h = SLO - S. The pool needs
ceil((rate * S + backlog) / rho_max) instances; the backlog term drains prompts already
queued within one interval.

Decode: the largest batch B* whose step time fits the ITL SLO (and whose sequences fit the
KV pool) is one instance's capacity; Little's law gives the sequences in flight,
rate * output_tokens * step_s(B*), or the observed number when larger.
"""

import math
from dataclasses import dataclass

from services.cost_model.perf_profile import PerfProfile

EPSILON = 1e-9


@dataclass(frozen=True)
class Need:
    replicas: int
    reason: str  # how the number came about, for the decision log


def max_prefill_utilization(service_s: float, ttft_slo_s: float, cap: float) -> float:
    """Highest M/D/1 utilization whose mean TTFT stays within the SLO (0 if none does)."""
    headroom_s = ttft_slo_s - service_s
    if headroom_s <= 0:
        return 0.0
    return min(cap, 2 * headroom_s / (service_s + 2 * headroom_s))


def prefill_need(profile: PerfProfile, request_rate: float, prompt_tokens: float, hit_ratio: float,
                 queue_depth: int, ttft_slo_s: float, interval_s: float, cap: float) -> Need:
    service_s = profile.prefill_s(prompt_tokens, prompt_tokens * hit_ratio)
    work = request_rate * service_s + queue_depth * service_s / interval_s  # instance-seconds per second
    utilization = max_prefill_utilization(service_s, ttft_slo_s - profile.request_overhead_s, cap)
    if utilization == 0.0:
        replicas = math.ceil(work / cap - EPSILON)
        return Need(replicas, f"TTFT SLO below one prefill ({service_s * 1e3:.0f} ms): sized at {cap:.0%}")
    replicas = math.ceil(work / utilization - EPSILON)
    return Need(replicas, f"prefill {service_s * 1e3:.0f} ms/prompt, work {work:.2f} at <= {utilization:.0%}")


def decode_batch_within(profile: PerfProfile, itl_slo_s: float, context_tokens: float,
                        sequence_tokens: float, max_batch_size: int) -> int:
    """Largest batch whose step fits the ITL SLO and whose sequences fit the KV pool (>= 1)."""
    a, b, c = profile.decode_fit
    per_sequence_s = b + c * context_tokens
    by_itl = max_batch_size if per_sequence_s <= 0 else math.floor((itl_slo_s - a) / per_sequence_s + EPSILON)
    by_kv = math.floor(profile.kv_capacity_tokens / max(1.0, sequence_tokens))
    return max(1, min(by_itl, by_kv, max_batch_size))


def decode_need(profile: PerfProfile, request_rate: float, prompt_tokens: float, output_tokens: float,
                observed_sequences: int, itl_slo_s: float, max_batch_size: int) -> Need:
    context = prompt_tokens + output_tokens / 2
    batch = decode_batch_within(profile, itl_slo_s, context, prompt_tokens + output_tokens, max_batch_size)
    step_s = profile.decode_step_s(batch, context)
    in_flight = request_rate * output_tokens * step_s
    sequences = max(in_flight, float(observed_sequences))
    replicas = math.ceil(sequences / batch - EPSILON)
    return Need(replicas, f"batch <= {batch} per instance at {step_s * 1e3:.0f} ms/step; "
                          f"{sequences:.1f} sequences in flight")
