"""TracingConfig: where spans go and which share of new traces is kept."""

from dataclasses import dataclass

from shared.errors import ConfigurationError

# Settings names, shared by every service's settings class (flags --otlp-traces-endpoint,
# --otlp-traces-sample-ratio; variables PDSERVE_OTLP_TRACES_ENDPOINT, ...).
ENDPOINT_SETTING = "otlp_traces_endpoint"
SAMPLE_RATIO_SETTING = "otlp_traces_sample_ratio"


@dataclass(frozen=True)
class TracingConfig:
    # An OTLP/gRPC collector, e.g. http://127.0.0.1:4317 ('' = tracing off). An http:// URL
    # (or a bare host:port) is plain gRPC, https:// is TLS.
    endpoint: str = ""
    # Share of the traces this process starts that are recorded and exported (a trace that
    # arrives with a parent follows the parent's decision).
    sample_ratio: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.sample_ratio <= 1.0:
            raise ConfigurationError(SAMPLE_RATIO_SETTING, f"must be within [0, 1], got {self.sample_ratio}")
        if self.endpoint and self.endpoint != self.endpoint.strip():
            raise ConfigurationError(ENDPOINT_SETTING, f"must not have surrounding spaces, got {self.endpoint!r}")

    @property
    def is_enabled(self) -> bool:
        return bool(self.endpoint)

    @property
    def is_insecure(self) -> bool:
        return not self.endpoint.startswith("https://")
