#!/usr/bin/env bash
# A STAND-IN for the official base image python:3.12-slim-bookworm, for machines that cannot
# pull it (no registry): Debian bookworm (debootstrap, minbase) plus this machine's CPython
# 3.12 copied to /usr/local, where the official image has it, with its runtime libraries.
# Committed into buildah's storage under the official name NAME (argument 1), labelled
# org.transformer-pde.stand-in=true, so that docker/Dockerfile builds unchanged. It is not the
# official image (another CPython build, no GPG-verified source); `buildah rmi NAME` drops
# it and the next `make image` pulls the real one where it can. Run as root (build.sh does).
set -euo pipefail
name=${1:?usage: standin-base.sh IMAGE-NAME}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# runtime libraries of CPython's extension modules (ssl, sqlite3, ctypes, lzma, ...) as in
# the official image, and ca-certificates, netbase, tzdata
LIBS=ca-certificates,netbase,tzdata,libbz2-1.0,libexpat1,libffi8,liblzma5,libncursesw6,libreadline8,libsqlite3-0,libssl3,libuuid1,zlib1g,libnsl2,libtirpc3,libgdbm6,libdb5.3

log() { echo "standin-base: $*"; }
[ "$(id -u)" = 0 ] || { echo "standin-base: must run as root (debootstrap)" >&2; exit 1; }
if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap (apt-get)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

# CPython 3.12 of this machine (the same search as docker/install.sh); its prefix must hold
# only it (a pyenv or /usr/local build), not a distribution's /usr
py=""
here=$(cd "$(dirname "$0")/.." && pwd)
for cand in "${PYTHON:-}" "$here/.venv/bin/python3.12" "$(command -v pyenv >/dev/null 2>&1 && pyenv root)/versions/3.12"*/bin/python3.12 \
            /root/.pyenv/versions/3.12*/bin/python3.12 "$(command -v python3.12 || true)"; do
    [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { py=$cand; break; }
done
[ -n "$py" ] || { echo "standin-base: no CPython 3.12 on this machine (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
prefix=$("$py" -c 'import sys; print(sys.base_prefix)')
pyver=$("$py" -c 'import platform; print(platform.python_version())')
[ "$prefix" != /usr ] || { echo "standin-base: $py is the system Python (/usr); need a self-contained build (pyenv)" >&2; exit 1; }

root=$(mktemp -d /var/tmp/tp-standin.XXXXXX)
ctr=""
cleanup() {
    [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1
    rm -rf "$root"
}
trap cleanup EXIT
log "debootstrap --variant=minbase bookworm from $MIRROR (about 2 minutes)"
debootstrap --variant=minbase --include="$LIBS" bookworm "$root" "$MIRROR" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; echo "standin-base: debootstrap failed (log above)" >&2; exit 1; }
rm -f "$root.log"

log "copying CPython $pyver from $prefix to /usr/local (without its tests, site-packages, static library)"
tar -C "$prefix" -cf - \
    --exclude=./lib/python3.12/test --exclude=./lib/python3.12/site-packages \
    --exclude='./lib/python3.12/config-3.12-*/*.a' --exclude='./lib/*.a' --exclude='__pycache__' . \
    | tar -C "$root/usr/local" -xf - --no-same-owner
mkdir -p "$root/usr/local/lib/python3.12/site-packages"
rm -f "$root"/usr/local/bin/{idle,2to3,pip}*
# the old prefix in scripts, sysconfig data and pkg-config files becomes /usr/local; the
# interpreter's RUNPATH names it too, but /usr/local/lib is on the loader's path
grep -rIl --null "$prefix" "$root/usr/local" | xargs -0 -r sed -i "s|$prefix|/usr/local|g"
chroot "$root" /sbin/ldconfig
PIP_ROOT_USER_ACTION=ignore chroot "$root" /usr/local/bin/python3.12 -m ensurepip --default-pip >/dev/null
chroot "$root" /usr/local/bin/python3 -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, uuid, readline, venv' \
    || { echo "standin-base: the copied Python misses a library" >&2; exit 1; }
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*

log "committing $name (stand-in) to buildah storage"
ctr=$(buildah from scratch)
mnt=$(buildah mount "$ctr")
cp -a "$root"/. "$mnt"/
buildah umount "$ctr" >/dev/null
buildah config \
    --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --env PYTHON_VERSION="$pyver" --cmd python3 \
    --label org.transformer-pde.stand-in=true \
    --label org.opencontainers.image.description="stand-in for $name: debootstrap bookworm + CPython $pyver of $(hostname) (docker/standin-base.sh)" \
    "$ctr"
buildah commit -q --rm "$ctr" "$name" >/dev/null
ctr=""
log "done: $name = Debian bookworm + CPython $pyver ($(buildah images --format '{{.Size}}' "$name" | head -1))"
