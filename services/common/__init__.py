"""What every engine instance shares, whatever its role: settings and flags, the gRPC server
with the standard health service, Redis registration with heartbeats, the prefix-index
publisher, GetStatus, and graceful shutdown. Role handlers plug into `InstanceRuntime`.
"""
