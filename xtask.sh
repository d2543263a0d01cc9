#!/bin/sh
# Bootstrap for a fresh Debian 12 machine (as root): make sure cargo exists,
# then hand over to `cargo xtask`, which installs everything else it needs.
set -eu
cd "$(dirname "$0")"
if ! command -v cargo >/dev/null 2>&1 && [ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]; then
    PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "xtask.sh: no cargo found; installing Debian's Rust toolchain (rustc-web, cargo-web)"
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        rustc-web cargo-web gcc libc6-dev ca-certificates
fi
exec cargo xtask "$@"
