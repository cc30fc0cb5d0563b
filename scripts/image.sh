#!/usr/bin/env bash
# The container image on this machine (`make image`, `make test-compose`), without any image
# registry: the Docker engine from Debian's packages, a Debian base image made from Debian's
# packages (debootstrap), and pip's own configuration of this machine for the Python packages.
#
#   scripts/image.sh engine              install docker.io, docker-compose, debootstrap; start dockerd
#   scripts/image.sh base                the local Debian base image (built once, then cached)
#   scripts/image.sh build TAG [BUILD]   deploy/compose/Dockerfile on that base -> TAG (label BUILD)
#   scripts/image.sh redis               a Redis image on that base, for the compose tests
#
# The daemon never pulls: builds pass --pull=false and every FROM names a local image. The
# installs are idempotent and quiet (output in build/image/*.log); dockerd keeps running
# (log: build/image/dockerd.log) like any system service.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly WORK_DIR="build/image"
readonly BASE_IMAGE="${PDSERVE_LOCAL_BASE_IMAGE:-pdserve-local/debian-python:bookworm}"
readonly REDIS_IMAGE="${PDSERVE_LOCAL_REDIS_IMAGE:-pdserve-local/redis:bookworm}"
readonly BASE_PACKAGES="python3,python3-venv,ca-certificates"
# Changing the base's recipe changes this, and the base is made again.
readonly BASE_RECIPE="debootstrap --variant=minbase --include=${BASE_PACKAGES} bookworm (1)"
readonly DEBIAN_PACKAGES=(docker.io docker-compose debootstrap)
readonly PYTHON=".venv/bin/python"

log() { echo "image: $*" >&2; }

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

# Runs a command with its output in a log file; on failure shows the log's tail, hosts masked.
run_logged() {
    local log_file="$1"
    shift
    echo "+ $*" >>"${log_file}"
    if ! "$@" >>"${log_file}" 2>&1; then
        log "FAILED: $*  (log: ${log_file})"
        tail -n 30 "${log_file}" | sed -E 's#[a-zA-Z+]+://[^ /]+#<host>#g' >&2
        return 1
    fi
}

install_packages() {
    local missing=() package
    for package in "${DEBIAN_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "${package}" 2>/dev/null | grep -q "ok installed" || missing+=("${package}")
    done
    [[ "${#missing[@]}" -eq 0 ]] && return 0
    log "installing Debian packages ${missing[*]}"
    run_logged "${WORK_DIR}/apt.log" as_root apt-get update -q
    run_logged "${WORK_DIR}/apt.log" as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
}

start_dockerd() {
    docker info >/dev/null 2>&1 && return 0
    log "starting dockerd (log: ${WORK_DIR}/dockerd.log)"
    as_root sh -c "nohup dockerd >>'${PWD}/${WORK_DIR}/dockerd.log' 2>&1 &"
    local waited=0
    until docker info >/dev/null 2>&1; do
        if (( waited >= 60 )); then
            log "dockerd did not come up in 60 s; its log:"
            tail -n 20 "${WORK_DIR}/dockerd.log" >&2
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
}

engine() {
    mkdir -p "${WORK_DIR}"
    install_packages
    start_dockerd
}

# The Debian mirror this machine's apt uses (deb822 or one-line sources), "" for debootstrap's.
debian_mirror() {
    cat /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null \
        | awk '/^URIs:/ {print $2} /^deb / {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; break}}' \
        | grep -v security | head -n 1 || true
}

base() {
    engine
    if [[ "$(docker image inspect -f '{{index .Config.Labels "pdserve.recipe"}}' "${BASE_IMAGE}" 2>/dev/null)" \
          == "${BASE_RECIPE}" ]]; then
        return 0
    fi
    log "making the Debian base ${BASE_IMAGE} with debootstrap (a few minutes, once)"
    local root
    root="$(mktemp -d "${TMPDIR:-/tmp}/pdserve-debootstrap.XXXXXX")"
    # shellcheck disable=SC2046 # an empty mirror means debootstrap's default
    run_logged "${WORK_DIR}/debootstrap.log" as_root debootstrap --variant=minbase --include="${BASE_PACKAGES}" \
        bookworm "${root}" $(debian_mirror)
    as_root sh -c "rm -rf '${root}'/var/cache/apt/archives/*.deb '${root}'/var/cache/apt/*.bin '${root}'/var/lib/apt/lists/*"
    as_root tar -C "${root}" -c . | docker import --change "LABEL pdserve.recipe=\"${BASE_RECIPE}\"" \
        --change "ENV LANG=C.UTF-8" --change 'CMD ["bash"]' - "${BASE_IMAGE}" >/dev/null
    as_root rm -rf "${root}"
}

build() {
    local tag="$1" build_id="${2:-}"
    base
    [[ -x "${PYTHON}" ]] || { log "${PYTHON} missing: run make setup"; return 1; }
    local build_args=() line
    while IFS= read -r line; do
        build_args+=(--build-arg "${line}")
    done < <("${PYTHON}" scripts/image_pip_args.py --stage-dir "${WORK_DIR}/pip-files")
    [[ -n "${build_id}" ]] || build_id="$(git rev-parse --short HEAD 2>/dev/null || echo dev)"
    log "building ${tag} (build ${build_id}) on ${BASE_IMAGE}; log: ${WORK_DIR}/build.log"
    local started=${SECONDS}
    : >"${WORK_DIR}/build.log"
    run_logged "${WORK_DIR}/build.log" docker build --pull=false -f deploy/compose/Dockerfile -t "${tag}" \
        --build-arg BASE_IMAGE="${BASE_IMAGE}" --build-arg PIP_FILES="${WORK_DIR}/pip-files" \
        --build-arg PDSERVE_BUILD_ID="${build_id}" "${build_args[@]}" .
    local size
    size="$(docker image inspect -f '{{.Size}}' "${tag}")"
    log "built ${tag} in $((SECONDS - started)) s: $((size / 1000000)) MB"
}

redis() {
    base
    docker image inspect "${REDIS_IMAGE}" >/dev/null 2>&1 && return 0
    log "building ${REDIS_IMAGE} on ${BASE_IMAGE}"
    run_logged "${WORK_DIR}/redis-build.log" docker build --pull=false -t "${REDIS_IMAGE}" \
        --build-arg BASE_IMAGE="${BASE_IMAGE}" - <<'DOCKERFILE'
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
USER redis
CMD ["redis-server", "--save", "", "--appendonly", "no"]
DOCKERFILE
}

main() {
    local command="${1:-}"
    [[ $# -gt 0 ]] && shift
    mkdir -p "${WORK_DIR}"
    case "${command}" in
        engine) engine ;;
        base) base ;;
        build) build "$@" ;;
        redis) redis ;;
        *) echo "usage: scripts/image.sh engine|base|build TAG [BUILD_ID]|redis" >&2; return 2 ;;
    esac
}

main "$@"
