#!/bin/sh
# Container entry: `pdserve serve ROLE [flags...]`. Scaled replicas share one configuration,
# so an engine instance advertises its own container address (gRPC and UCX) unless
# PDSERVE_ADVERTISE_HOST / PDSERVE_UCX_HOST say otherwise.
set -eu
role="${1:-gateway}"
[ "$#" -gt 0 ] && shift
if [ "${role}" != "gateway" ]; then
    own_address="$(python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')"
    export PDSERVE_ADVERTISE_HOST="${PDSERVE_ADVERTISE_HOST:-${own_address}}"
    export PDSERVE_UCX_HOST="${PDSERVE_UCX_HOST:-${own_address}}"
fi
exec pdserve serve "${role}" "$@"
