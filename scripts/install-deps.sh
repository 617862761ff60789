#!/usr/bin/env bash
# Installs what building and testing ferry needs, and nothing that is already there.
#
#   scripts/install-deps.sh           Debian packages for the build and tests, plus the Python venv
#   scripts/install-deps.sh --lint    also clang-format and clang-tidy (for make format / make tidy)
#   scripts/install-deps.sh --no-venv only the Debian packages
#
# Idempotent and quiet on a provisioned machine: installed packages are checked with dpkg-query, so
# apt is not touched unless something is missing (then `apt-get update` runs once, before the
# install). Runs as root, or through sudo when it is available. Never reads standard input.
#
# Python: a virtual environment at .venv in the checkout gets requirements-dev.txt. A stamp file in
# the venv holds the hash of the requirements it was built from, so pip only runs when they change.
# Environment: PYTHON (interpreter for the venv, default python3), FERRY_VENV (default <repo>/.venv).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

want_lint=0
want_venv=1
for arg in "$@"; do
  case "$arg" in
    --lint) want_lint=1 ;;
    --no-venv) want_venv=0 ;;
    -h | --help)
      sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "install-deps: unknown argument '$arg' (see --help)" >&2
      exit 2
      ;;
  esac
done

log() { echo "install-deps: $*" >&2; }

# ---- Debian packages ----
packages=(
  build-essential cmake ninja-build pkg-config ccache
  libgtest-dev libgmock-dev
  clang-14 libclang-rt-14-dev
  libibverbs-dev librdmacm-dev rdma-core ibverbs-providers
  iproute2 procps iperf3
  python3 python3-venv
  libssl-dev libhiredis-dev libcurl4-openssl-dev libcli11-dev libcpp-httplib-dev
  redis-server etcd-server etcd-client
  rclone
)
if ((want_lint)); then
  packages+=(clang-format-14 clang-tidy-14)
fi

install_packages() {
  # One dpkg-query for all packages; names it does not know at all are simply not listed.
  local -A installed=()
  local name status
  while read -r name status; do
    if [[ "$status" == "installed" ]]; then installed["${name%%:*}"]=1; fi
  done < <(dpkg-query -W -f='${Package} ${db:Status-Status}\n' "${packages[@]}" 2>/dev/null || true)

  local missing=()
  local pkg
  for pkg in "${packages[@]}"; do
    [[ -n "${installed[$pkg]:-}" ]] || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi

  local as_root=()
  if ((EUID != 0)); then
    if command -v sudo >/dev/null 2>&1; then
      # -n: fail instead of asking for a password, since there may be no terminal.
      as_root=(sudo -n)
    else
      log "missing packages: ${missing[*]}"
      log "not root and no sudo: install them as root, then run this again"
      return 1
    fi
  fi

  log "installing: ${missing[*]}"
  local apt_env=(env DEBIAN_FRONTEND=noninteractive NEEDRESTART_MODE=a)
  local apt_opts=(-q -o DPkg::Lock::Timeout=300)
  "${as_root[@]}" "${apt_env[@]}" apt-get "${apt_opts[@]}" update </dev/null
  "${as_root[@]}" "${apt_env[@]}" apt-get "${apt_opts[@]}" install -y --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    "${missing[@]}" </dev/null
}

if command -v dpkg-query >/dev/null 2>&1; then
  install_packages
else
  log "dpkg-query not found: not a Debian system, skipping system packages (need: ${packages[*]})"
fi

# ---- Python virtual environment ----
setup_venv() {
  local python="${PYTHON:-python3}"
  local venv="${FERRY_VENV:-$repo_root/.venv}"
  local requirements="$repo_root/requirements-dev.txt"
  local stamp="$venv/.ferry-requirements.sha256"

  # A venv whose interpreter no longer runs (moved checkout, removed Python) is rebuilt.
  if [[ -d "$venv" ]] && ! "$venv/bin/python3" -c 'import sys' >/dev/null 2>&1; then
    log "rebuilding broken virtual environment $venv"
    rm -rf "$venv"
  fi
  if [[ ! -x "$venv/bin/python3" ]]; then
    log "creating virtual environment $venv"
    "$python" -m venv "$venv"
  fi

  [[ -f "$requirements" ]] || return 0
  local want
  want="$(sha256sum "$requirements" | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  log "installing Python packages from requirements-dev.txt"
  PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$venv/bin/python3" -m pip install -q -r "$requirements" </dev/null
  echo "$want" >"$stamp"
}

if ((want_venv)); then
  setup_venv
fi
