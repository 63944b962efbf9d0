#!/usr/bin/env bash
# Debian packages m2flow needs: graphviz (the dry run's graph pictures), Mesa's EGL (headless
# MuJoCo rendering for camera simulators) and iproute2 (the tests' hosts in network namespaces).
# Installs them when missing and we may (root with apt-get); otherwise says what to install.
set -euo pipefail
missing=()
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
ldconfig -p 2>/dev/null | grep -q libEGL_mesa || missing+=(libegl1 libegl-mesa0 libgl1-mesa-dri)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "m2flow: please install these system packages: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
fi
