"""Next-interval load: Holt's linear smoothing (level + trend) of the request rate, and
exponential moving averages of the prompt and output lengths."""

from dataclasses import dataclass


@dataclass
class HoltForecaster:
    """Double exponential smoothing; `predict()` is one interval ahead, never negative."""

    alpha: float = 0.5  # weight of the newest value in the level
    beta: float = 0.3  # weight of the newest change in the trend
    level: float | None = None
    trend: float = 0.0

    def update(self, value: float) -> None:
        if self.level is None:
            self.level = value
            return
        previous = self.level
        self.level = self.alpha * value + (1 - self.alpha) * (previous + self.trend)
        self.trend = self.beta * (self.level - previous) + (1 - self.beta) * self.trend

    def predict(self) -> float:
        return 0.0 if self.level is None else max(0.0, self.level + self.trend)


@dataclass
class MovingAverage:
    """EMA that ignores intervals without a sample (no completions: lengths unknown)."""

    alpha: float = 0.3
    value: float | None = None
    keep_zero: bool = False  # a ratio: 0 is a real sample (a length of 0 means "none completed")

    def update(self, sample: float | None) -> None:
        if sample is None or sample < 0 or (sample == 0 and not self.keep_zero):
            return
        self.value = sample if self.value is None else self.alpha * sample + (1 - self.alpha) * self.value

    def get(self, default: float) -> float:
        return default if self.value is None else self.value


@dataclass(frozen=True)
class LoadForecast:
    request_rate: float
    prompt_tokens: float
    output_tokens: float
    prefix_hit_ratio: float


class LoadForecaster:
    def __init__(self, default_prompt_tokens: float, default_output_tokens: float):
        self.rate = HoltForecaster()
        self.prompt = MovingAverage()
        self.output = MovingAverage()
        self.hit_ratio = MovingAverage(keep_zero=True)
        self.defaults = (default_prompt_tokens, default_output_tokens)

    def update(self, request_rate: float, prompt_tokens: float, output_tokens: float,
               hit_ratio: float | None) -> None:
        self.rate.update(request_rate)
        self.prompt.update(prompt_tokens)
        self.output.update(output_tokens)
        self.hit_ratio.update(hit_ratio)

    def predict(self) -> LoadForecast:
        return LoadForecast(self.rate.predict(), self.prompt.get(self.defaults[0]),
                            self.output.get(self.defaults[1]), self.hit_ratio.get(0.0))
