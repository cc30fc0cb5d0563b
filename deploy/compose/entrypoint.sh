#!/bin/sh
# Container entry: `pdserve serve ROLE [flags...]` for a role (gateway, prefill, decode,
# colocated, planner; none: gateway), any other command as given (`pdserve status ...`).
# Scaled replicas share one configuration, so an engine instance advertises its own
# container address (gRPC and UCX) unless PDSERVE_ADVERTISE_HOST / PDSERVE_UCX_HOST say
# otherwise. A ready file left by the container's previous run is removed first: the health
# probe reads the port from it.
set -eu
role="${1:-gateway}"
[ "$#" -gt 0 ] && shift
case "${role}" in
    gateway | planner) ;;
    prefill | decode | colocated)
        own_address="$(python -c 'import socket; print(socket.gethostbyname(socket.gethostname()))')"
        export PDSERVE_ADVERTISE_HOST="${PDSERVE_ADVERTISE_HOST:-${own_address}}"
        export PDSERVE_UCX_HOST="${PDSERVE_UCX_HOST:-${own_address}}"
        ;;
    *) exec "${role}" "$@" ;;
esac
if [ -n "${PDSERVE_READY_FILE:-}" ]; then
    rm -f "${PDSERVE_READY_FILE}"
fi
exec pdserve serve "${role}" "$@"
