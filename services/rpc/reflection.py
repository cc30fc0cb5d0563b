"""The standard gRPC server reflection service, so grpcurl, Postman and evans can call a server
without the .proto files. The gateway and every instance turn it on at construction."""

from grpc_reflection.v1alpha import reflection


def enable_reflection(server, service_names: list[str]) -> None:
    """Serve reflection for `service_names` (full names, e.g. "pdserve.v1.Gateway") and itself."""
    reflection.enable_server_reflection([*service_names, reflection.SERVICE_NAME], server)
