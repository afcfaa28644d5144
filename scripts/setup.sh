#!/usr/bin/env bash
# Installs everything pirated needs to build, run its demo and run its tests, idempotently.
# Needs root (apt, bpffs). Safe to run again: each step checks before it acts.
set -euo pipefail

log() { printf '\033[1msetup:\033[0m %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: must run as root (apt-get, mounting bpffs, loading XDP programs)" >&2
    exit 1
fi

# Build toolchain for the eBPF crate (LLVM 22 for bpf-linker) and the tools the testbeds drive.
APT_PACKAGES=(
    llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev clang-22
    bpftool iproute2 ethtool iptables tcpdump wireshark-common
    iputils-ping netcat-openbsd nginx wrk redis-server redis-tools curl iperf3
    nghttp2-client unbound dnsutils dnsperf python3-grpcio python3-venv netsniff-ng
    prometheus systemd libcap2-bin util-linux
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The testbeds start their own nginx/redis/unbound inside namespaces; the distro units must not
# hold the ports.
for svc in nginx redis-server unbound; do
    systemctl disable --now "$svc" >/dev/null 2>&1 || true
done

# A real QUIC stack for the testbeds (aioquic, from PyPI: Debian has none), in a venv of Debian's
# Python of its own, pinned.
AIOQUIC_VERSION=1.7.2
QUIC_VENV=/opt/pirate-tests/venv
if ! "$QUIC_VENV/bin/python" -c "import aioquic, sys; sys.exit(aioquic.__version__ != '$AIOQUIC_VERSION')" 2>/dev/null; then
    log "pip install aioquic==$AIOQUIC_VERSION into $QUIC_VENV"
    /usr/bin/python3 -m venv "$QUIC_VENV"
    "$QUIC_VENV/bin/pip" install -q "aioquic==$AIOQUIC_VERSION"
fi

# Nightly with rust-src builds core for bpfel-unknown-none.
if ! rustup toolchain list | grep -q '^nightly'; then
    log "rustup toolchain install nightly"
    rustup toolchain install nightly --profile minimal
fi
if ! rustup component list --toolchain nightly --installed | grep -q '^rust-src'; then
    log "rustup component add rust-src --toolchain nightly"
    rustup component add rust-src --toolchain nightly
fi

# bpf-linker linked against the system's LLVM 22 (its bundled LLVM cannot be downloaded here).
BPF_LINKER_VERSION=0.13.0
if ! bpf-linker --version 2>/dev/null | grep -q "$BPF_LINKER_VERSION"; then
    log "cargo install bpf-linker $BPF_LINKER_VERSION (LLVM 22, ~1 minute)"
    PATH=/usr/lib/llvm-22/bin:$PATH cargo install --locked "bpf-linker@$BPF_LINKER_VERSION" \
        --no-default-features --features llvm-22
fi

# cargo-fuzz drives the fuzz targets (fuzz/) that the test command runs for a bounded time.
CARGO_FUZZ_VERSION=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    log "cargo install cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install --locked "cargo-fuzz@$CARGO_FUZZ_VERSION"
fi

# bpffs is where pirated pins its maps; a fresh machine does not mount it. Root's alone (mode
# 0700, as systemd mounts it): the pins are no one else's to read or replace. The unit shows the
# service its own directory there (configs/pirated.service).
if ! mountpoint -q /sys/fs/bpf; then
    log "mount -t bpf -o mode=0700 bpf /sys/fs/bpf"
    mount -t bpf -o mode=0700 bpf /sys/fs/bpf
elif [ "$(stat -c %a /sys/fs/bpf)" != 700 ]; then
    log "chmod 0700 /sys/fs/bpf (was $(stat -c %a /sys/fs/bpf))"
    chmod 0700 /sys/fs/bpf
fi

log "ok"
