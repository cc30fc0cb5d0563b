"""Planner: every interval, observation -> forecast -> each pool's need -> hysteresis ->
desired replicas for prefill and for decode, decided separately. Pure logic: no I/O, the
clock is passed in; the service (services.planner.service) feeds it and acts on it."""

import json
import logging
from dataclasses import asdict, dataclass

from services.planner import sizing
from services.planner.config import PlannerConfig
from services.planner.forecast import LoadForecast, LoadForecaster
from services.planner.observation import Observation
from services.planner.policy import PoolDecision, PoolPolicy
from services.cost_model.perf_profile import PerfProfile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanDecision:
    at: float
    observation: Observation
    forecast: LoadForecast
    prefill: PoolDecision
    decode: PoolDecision

    def log_line(self) -> str:
        """One JSON object: inputs, forecast and both pools' decisions with their reasons."""
        return json.dumps({"at": round(self.at, 3), "observed": self.observation.as_log_fields(),
                           "forecast": {k: round(v, 4) for k, v in asdict(self.forecast).items()},
                           "prefill": asdict(self.prefill), "decode": asdict(self.decode)})


class Planner:
    def __init__(self, config: PlannerConfig, profile: PerfProfile, num_prefill: int, num_decode: int):
        self.config = config
        self.profile = profile
        self.forecaster = LoadForecaster(config.default_prompt_tokens, config.default_output_tokens)
        self.prefill = PoolPolicy("prefill", config, num_prefill)
        self.decode = PoolPolicy("decode", config, num_decode)

    def plan(self, observation: Observation, now: float) -> PlanDecision:
        self.forecaster.update(observation.request_rate, observation.mean_prompt_tokens,
                               observation.mean_output_tokens, observation.prefix_hit_ratio)
        load = self.forecaster.predict()
        decision = PlanDecision(now, observation, load, self._plan_prefill(observation, load, now),
                                self._plan_decode(observation, load, now))
        logger.info("planner decision %s", decision.log_line())
        return decision

    def _prefill_need(self, observation: Observation, load: LoadForecast, scale: float) -> sizing.Need:
        config = self.config
        return sizing.prefill_need(self.profile, load.request_rate * scale, load.prompt_tokens, load.prefix_hit_ratio,
                                   observation.prefill_queue_depth, config.ttft_slo_s, config.interval_s,
                                   config.max_prefill_utilization)

    def _decode_need(self, observation: Observation, load: LoadForecast, scale: float) -> sizing.Need:
        in_flight = round((observation.decode_running + observation.decode_queue_depth) * scale)
        return sizing.decode_need(self.profile, load.request_rate * scale, load.prompt_tokens, load.output_tokens,
                                  in_flight, self.config.itl_slo_s, self.config.max_batch_size)

    def _plan_prefill(self, observation: Observation, load: LoadForecast, now: float) -> PoolDecision:
        need = self._prefill_need(observation, load, 1.0)
        with_margin = self._prefill_need(observation, load, 1.0 + self.config.scale_in_margin)
        return self.prefill.decide(need.replicas, with_margin.replicas, now, need.reason)

    def _plan_decode(self, observation: Observation, load: LoadForecast, now: float) -> PoolDecision:
        need = self._decode_need(observation, load, 1.0)
        with_margin = self._decode_need(observation, load, 1.0 + self.config.scale_in_margin)
        return self.decode.decide(need.replicas, with_margin.replicas, now, need.reason)
