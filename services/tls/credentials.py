"""TLS credentials for the gRPC servers and channels (PEM files, as `pdserve certs` writes).

Instances serve mutual TLS: with a CA file they accept only clients presenting a
certificate that CA signed (the gateway's). The gateway's public port serves plain TLS;
its channels to the instances present the gateway's client certificate and trust only the
stack's CA.
"""

from pathlib import Path

import grpc

from shared.errors import ConfigurationError


def read_pem(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigurationError(setting, f"cannot read {path}: {error.strerror}") from error


def server_credentials(cert_file: str, key_file: str, client_ca_file: str | None = None) -> grpc.ServerCredentials:
    """TLS with this certificate; with `client_ca_file`, clients must present a certificate it signed."""
    pair = (read_pem(key_file, "tls_key_file"), read_pem(cert_file, "tls_cert_file"))
    if not client_ca_file:
        return grpc.ssl_server_credentials([pair])
    return grpc.ssl_server_credentials([pair], root_certificates=read_pem(client_ca_file, "tls_ca_file"),
                                       require_client_auth=True)


def channel_credentials(ca_file: str, cert_file: str | None = None,
                        key_file: str | None = None) -> grpc.ChannelCredentials:
    """Trust servers signed by `ca_file`; present `cert_file` when given (mutual TLS)."""
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(ca_file, "instance_tls_ca_file"),
        private_key=read_pem(key_file, "instance_tls_key_file") if key_file else None,
        certificate_chain=read_pem(cert_file, "instance_tls_cert_file") if cert_file else None)


def instance_credentials(settings) -> grpc.ServerCredentials | None:
    """An instance's server credentials from its tls_* settings (None: plain TCP)."""
    if not settings.tls_cert_file:
        return None
    return server_credentials(settings.tls_cert_file, settings.tls_key_file, settings.tls_ca_file or None)
