#!/usr/bin/env bash
# Installs what the JetStream tests need from Debian's packages: the NATS server, and the
# openssl command that makes the test cluster's certificates. Prints the server's version.
set -euo pipefail

# Debian installs the binary in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/sbin:/usr/bin"

missing=()
command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    if ! $sudo apt-get install -y "${missing[@]}"; then
        $sudo apt-get update
        $sudo apt-get install -y "${missing[@]}"
    fi
fi

nats-server --version
