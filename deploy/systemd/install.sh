#!/bin/sh
# Install cascade's systemd units and everything they read, from this checkout:
#
#   sudo deploy/systemd/install.sh                  # on the host that runs cascade
#   DESTDIR=/tmp/root deploy/systemd/install.sh     # into a staging root (packages, tests)
#
# It creates the system user and group `cascade`, the directories (/etc/cascade, the state
# directory /var/lib/cascade with /var/lib/cascade/models for the weights, the cache
# /var/cache/cascade), the virtualenv PREFIX/.venv (from deploy/lock/serve.txt, hashes
# checked), /etc/cascade/gateway.env and clef.env, the API and admin keys files gateway.env
# points to (one random key each, mode 0640, owner root, group cascade: the service reads them
# and cannot change them), /etc/cascade/policy.toml (policies/systemd.toml), the README the units'
# Documentation= names, and the two units. Files under /etc/cascade that exist are kept (your
# edits survive a re-run); the units and the README are replaced. It neither downloads weights
# nor starts anything: it ends by printing what to do next.
#
# Settings (environment variables):
#   DESTDIR  a staging root put before every path. Nothing outside it is changed: no useradd,
#            no chown, no virtualenv (one is not relocatable; build it on the host), no
#            systemctl. What would be done is printed instead.
#   PREFIX   where the virtualenv and the README go (default /opt/cascade); the installed
#            units are rewritten to match.
#   VENV     an existing virtualenv with cascade-router installed: PREFIX/.venv becomes a
#            symbolic link to it instead of a new one being built.
#   PYTHON   the interpreter for a new virtualenv (default python3.11, else python3).
#   UNITDIR  where the units go (default /etc/systemd/system).
#   TORCH_CUDA_INDEX  the PyTorch index of the CUDA build that replaces the lock's CPU torch
#            when nvidia-smi is found (default https://download.pytorch.org/whl/cu128).
# /etc/cascade, /var/lib/cascade and /var/cache/cascade are fixed: the units name them
# (EnvironmentFile=, StateDirectory=cascade, CacheDirectory=cascade).
set -eu

SRC=$(cd "$(dirname "$0")/../.." && pwd)
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/opt/cascade}
UNITDIR=${UNITDIR:-/etc/systemd/system}
VENV=${VENV:-}
TORCH_CUDA_INDEX=${TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}
USER_NAME=cascade
ETC=/etc/cascade
STATE=/var/lib/cascade
MODELS=$STATE/models
CACHE=/var/cache/cascade

say() { printf '%s\n' "$*"; }
fail() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }

# Changes outside DESTDIR: run them on the host, print them when staging.
host() {
    if [ -n "$DESTDIR" ]; then
        say "would run: $*"
    else
        "$@"
    fi
}

# A directory with its mode, owned by OWNER:GROUP on the host.
directory() {  # MODE OWNER GROUP PATH
    install -d -m "$1" "$DESTDIR$4"
    host chown "$2:$3" "$4"
}

# A file installed only if it is not there yet (an operator's edits are kept).
config() {  # MODE SOURCE PATH
    if [ -e "$DESTDIR$3" ]; then
        say "kept $3 (it exists)"
        return
    fi
    install -m "$1" "$2" "$DESTDIR$3"
    host chown "root:$USER_NAME" "$3"
    say "installed $3"
}

[ -n "$DESTDIR" ] || [ "$(id -u)" -eq 0 ] || fail "run as root (sudo), or set DESTDIR to stage"
[ -f "$SRC/pyproject.toml" ] && [ -f "$SRC/policies/systemd.toml" ] \
    || fail "$SRC is not a cascade checkout"
case $PREFIX in /*) ;; *) fail "PREFIX must be an absolute path: $PREFIX" ;; esac

# The user and group both units run as.
if [ -n "$DESTDIR" ] || ! id -u "$USER_NAME" >/dev/null 2>&1; then
    host useradd --system --user-group --home-dir "$STATE" --no-create-home \
        --shell /usr/sbin/nologin "$USER_NAME"
fi

# Directories. The service may write only its state (ONNX exports) and cache (HF_HOME).
directory 0755 root root "$PREFIX"
directory 0750 root "$USER_NAME" "$ETC"
directory 0750 "$USER_NAME" "$USER_NAME" "$STATE"
directory 0750 "$USER_NAME" "$USER_NAME" "$MODELS"
directory 0750 "$USER_NAME" "$USER_NAME" "$CACHE"
directory 0750 "$USER_NAME" "$USER_NAME" "$CACHE/hf"
install -d -m 0755 "$DESTDIR$UNITDIR" "$DESTDIR$PREFIX/share/doc/cascade/docs"

# The virtualenv: an existing one, or one from the serving lock.
if [ -n "$VENV" ]; then
    [ -x "$VENV/bin/cascade" ] || fail "VENV=$VENV has no bin/cascade"
    ln -sfn "$VENV" "$DESTDIR$PREFIX/.venv"
    say "linked $PREFIX/.venv -> $VENV"
else
    python=${PYTHON:-$(command -v python3.11 || command -v python3 || echo python3)}
    pip="$PREFIX/.venv/bin/pip"
    host "$python" -m venv "$PREFIX/.venv"
    # --no-deps: the lock is complete; its torch is the CPU build, from PyTorch's index.
    host "$pip" install --quiet --no-deps --require-hashes \
        --extra-index-url https://download.pytorch.org/whl/cpu -r "$SRC/deploy/lock/serve.txt"
    host "$pip" install --quiet --no-deps --no-build-isolation "$SRC"
    if command -v nvidia-smi >/dev/null 2>&1; then
        # cascade-clef.service runs Clef-flash on the GPU: the CUDA build of the same torch.
        host "$pip" install --quiet --index-url "$TORCH_CUDA_INDEX" torch==2.13.0
    fi
fi

# Settings, keys and policy (kept when present).
config 0640 "$SRC/deploy/systemd/gateway.env" "$ETC/gateway.env"
config 0640 "$SRC/deploy/systemd/clef.env" "$ETC/clef.env"
config 0644 "$SRC/policies/systemd.toml" "$ETC/policy.toml"
# key_file NAME HEADER: $ETC/NAME with a new random key (after HEADER, when not empty), kept
# when present.
key_file() {
    if [ -e "$DESTDIR$ETC/$1" ]; then
        say "kept $ETC/$1 (it exists)"
        return
    fi
    keys=$(mktemp)
    trap 'rm -f "$keys"' EXIT
    {
        [ -z "$2" ] || say "$2"
        od -An -N32 -tx1 /dev/urandom | tr -d ' \n'
        say
    } >"$keys"
    install -m 0640 "$keys" "$DESTDIR$ETC/$1"
    rm -f "$keys"
    host chown "root:$USER_NAME" "$ETC/$1"
    say "installed $ETC/$1 with a new random key (read it as root)"
}
key_file api-keys "# Bearer keys for the cascade gateway, one per line (docs/configuration.md)."
# The admin key (/metrics, /health's details, /admin): the key alone, so a Prometheus can send
# the file as its authorization credentials_file.
key_file admin-keys ""

# The README and the reference pages the units' Documentation= points to, and the units, with
# PREFIX substituted.
install -m 0644 "$SRC/README.md" "$DESTDIR$PREFIX/share/doc/cascade/README.md"
install -m 0644 "$SRC"/docs/*.md "$DESTDIR$PREFIX/share/doc/cascade/docs/"
for unit in cascade-gateway.service cascade-clef.service; do
    sed "s|/opt/cascade/|$PREFIX/|g" "$SRC/deploy/systemd/$unit" >"$DESTDIR$UNITDIR/$unit"
    chmod 0644 "$DESTDIR$UNITDIR/$unit"
    say "installed $UNITDIR/$unit"
done
host systemctl daemon-reload

say "
Next:
  1. Put the weights in $MODELS (the service reads them offline, HF_HUB_OFFLINE=1):
       hf download convaiinnovations/laya --local-dir $MODELS/laya
       hf download Cloudflare/clef-flash --local-dir $MODELS/clef-flash
     then make them readable by $USER_NAME: chown -R $USER_NAME:$USER_NAME $MODELS
  2. Review $ETC/gateway.env, $ETC/clef.env and $ETC/policy.toml.
  3. systemctl enable --now cascade-clef cascade-gateway
  4. curl -H \"Authorization: Bearer \$(grep -v '^#' $ETC/api-keys | head -n 1)\" \\
          http://127.0.0.1:8000/v1/models"
