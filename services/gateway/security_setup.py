"""The gateway's security objects built from its settings: access control (API keys,
per-key limits) and TLS credentials (public ports; mutual TLS towards the instances)."""

import grpc

from services.tls.credentials import channel_credentials, server_credentials
from services.gateway.access import AccessControl
from services.gateway.api_keys import load_api_keys
from services.gateway.rate_limits import KeyRateLimiter
from services.gateway.settings import GatewaySettings


def access_control(settings: GatewaySettings) -> AccessControl:
    keys = load_api_keys(settings.api_key, settings.api_keys_file)
    limiter = KeyRateLimiter(settings.rate_limit_rps, settings.rate_limit_burst, settings.max_concurrent_per_key)
    return AccessControl(keys, limiter, metrics_requires_key=settings.metrics_requires_key)


def public_credentials(settings: GatewaySettings) -> grpc.ServerCredentials | None:
    if not settings.tls_cert_file:
        return None
    return server_credentials(settings.tls_cert_file, settings.tls_key_file)


def instance_channel_credentials(settings: GatewaySettings) -> grpc.ChannelCredentials | None:
    if not settings.instance_tls_ca_file:
        return None
    return channel_credentials(settings.instance_tls_ca_file, settings.instance_tls_cert_file,
                               settings.instance_tls_key_file)
