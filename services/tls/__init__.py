"""TLS for the gRPC servers and channels: credentials from PEM files, and the development
certificate authority `pdserve certs` writes.
"""
