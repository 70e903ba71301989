# Shared helpers for the scripts in this folder. Sourced, not run.

step() { printf '\n==> %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }

# A C compiler is needed to build zstd (and to link at all).
ensure_build_tools() {
    if command -v cc >/dev/null 2>&1; then
        return
    fi
    step "installing a C toolchain (build-essential)"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq build-essential pkg-config
}
