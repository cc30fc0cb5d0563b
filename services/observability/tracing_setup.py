"""Tracing settings every service shares (services.settings.service_settings: each a flag, a
PDSERVE_* variable and a settings-file key) and the call that turns tracing on for a role.

    --otlp-traces-endpoint http://collector:4317    PDSERVE_OTLP_TRACES_ENDPOINT
    --otlp-traces-sample-ratio 0.1                  PDSERVE_OTLP_TRACES_SAMPLE_RATIO

Each process names itself `pdserve-<role>` (service.name): pdserve-gateway, pdserve-prefill,
pdserve-decode, pdserve-colocated; an instance's engine-core process is pdserve-engine-core
with the instance's role and id as attributes.
"""

from pydantic import Field

from shared.tracing import TracingConfig, configure_tracing

from services.settings.service_settings import ServiceSettings

SERVICE_NAME_PREFIX = "pdserve-"


class TracingSettings(ServiceSettings):
    otlp_traces_endpoint: str = Field(
        "", description="export OpenTelemetry traces over OTLP/gRPC to this collector, e.g. http://127.0.0.1:4317 "
                        "(https:// for TLS; '' = tracing off, at no cost)")
    otlp_traces_sample_ratio: float = Field(
        1.0, ge=0, le=1, description="share of new traces recorded (a request that arrives with a sampled "
                                     "`traceparent` is always traced)")

    @property
    def tracing_config(self) -> TracingConfig:
        return TracingConfig(self.otlp_traces_endpoint, self.otlp_traces_sample_ratio)


def service_name(role: str) -> str:
    return SERVICE_NAME_PREFIX + role


def start_tracing(settings: TracingSettings, role: str, instance_id: str = "") -> bool:
    """Turn tracing on for this process (and the engine-core processes it starts) when an
    endpoint is set; True if it is on."""
    attributes = {"pdserve.role": role}
    if instance_id:
        attributes["service.instance.id"] = instance_id
    return configure_tracing(settings.tracing_config, service_name(role), attributes)


def tracing_args(settings: TracingSettings) -> list[str]:
    """The flags that pass this process's tracing settings on to a child (`pdserve up`)."""
    if not settings.otlp_traces_endpoint:
        return []
    return [f"--otlp-traces-endpoint={settings.otlp_traces_endpoint}",
            f"--otlp-traces-sample-ratio={settings.otlp_traces_sample_ratio}"]
