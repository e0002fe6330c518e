#!/usr/bin/env bash
# make image: build docker/Dockerfile, solve inside the image, write a `docker load`-able
# archive results/image/transformer-pde-<version>-<lock>.tar (docker/README.md).
#
# The engine: `docker build` where a Docker daemon answers, else buildah (installed from
# Debian packages when missing, as root). The base python:3.12-slim-bookworm is pulled;
# where no registry can be reached, docker/standin-base.sh makes a local STAND-IN for it
# (Debian bookworm + this machine's CPython 3.12), cached in buildah's storage.
#
# Environment: IMAGE_ENGINE=docker|buildah (default: detect), IMAGE_OUT (default
# results/image), CA_BUNDLE (the CA bundle given to pip as the build secret `ca`; default
# $PIP_CERT, $SSL_CERT_FILE or /etc/ssl/certs/ca-certificates.crt when present), EXTRAS
# (build-arg, default none), SMOKE=0 skips the solve and the tests in the image.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
t0=$SECONDS
n=0
step() { n=$((n + 1)); printf '\n==> make image [%d, %ds] %s\n' "$n" $((SECONDS - t0)) "$*"; }
die() { echo "make image: error: $*" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
lock=$(sha256sum requirements.lock | cut -c1-12)
[ -n "$version" ] || die "no project version in pyproject.toml"
name=transformer-pde:$version-$lock
out=${IMAGE_OUT:-results/image}
archive=$out/transformer-pde-$version-$lock.tar
base=docker.io/library/python:3.12-slim-bookworm
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ "$revision" != unknown ] && [ -n "$(git status --porcelain 2>/dev/null)" ] && revision=$revision-dirty
source=$(git config --get remote.origin.url 2>/dev/null || echo unknown)
EXTRAS=${EXTRAS:-}
ca=${CA_BUNDLE:-}
if [ -z "$ca" ]; then
    for f in "${PIP_CERT:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
        [ -n "$f" ] && [ -s "$f" ] && { ca=$f; break; }
    done
fi
mkdir -p "$out"

# ---- 1. the engine ----------------------------------------------------------------------
step "choosing the build engine"
engine=${IMAGE_ENGINE:-}
if [ -z "$engine" ]; then
    if command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1; then
        engine=docker
    elif command -v buildah >/dev/null 2>&1; then
        engine=buildah
    elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "no Docker daemon and no buildah: installing buildah (apt-get)"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah >/dev/null) \
            || die "could not install buildah with apt-get"
        engine=buildah
    else
        die "needs a running Docker daemon or buildah; neither is here, and buildah can only be installed as root with apt-get (Debian/Ubuntu)"
    fi
fi
case $engine in
    docker) echo "docker build (daemon: $(docker info --format '{{.ServerVersion}}' 2>/dev/null))" ;;
    buildah) echo "buildah $(buildah --version | cut -d' ' -f3) (no Docker daemon; storage $(buildah info --format '{{.store.GraphRoot}}' 2>/dev/null || echo '?'))" ;;
    *) die "IMAGE_ENGINE must be docker or buildah, not '$engine'" ;;
esac
[ "$engine" = buildah ] && [ "$(id -u)" != 0 ] && echo "warning: buildah as non-root needs subuid/subgid ranges (rootless)"

# ---- 2. the base image ------------------------------------------------------------------
if [ "$engine" = buildah ]; then
    step "base image $base"
    if buildah inspect --type image "$base" >/dev/null 2>&1; then
        echo "cached in buildah storage"
    elif timeout 300 buildah pull -q "$base" >/dev/null 2>"$out/pull.log"; then
        echo "pulled"
    else
        echo "cannot pull it ($(tail -1 "$out/pull.log" | cut -c1-160))"
        [ "$(id -u)" = 0 ] || die "cannot pull $base, and a stand-in needs root (debootstrap)"
        echo "building a local STAND-IN (debootstrap bookworm + this machine's CPython 3.12; docker/standin-base.sh)"
        bash docker/standin-base.sh "$base"
    fi
    rm -f "$out/pull.log"
    if [ "$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "org.transformer-pde.stand-in"}}' "$base" 2>/dev/null)" = true ]; then
        echo "note: the base is the local stand-in, not the official image (buildah rmi $base to drop it)"
    fi
fi

# ---- 3. the image -----------------------------------------------------------------------
step "building $name from docker/Dockerfile (cached layers are reused)"
args=(-f docker/Dockerfile -t "$name" --build-arg VERSION="$version" --build-arg REVISION="$revision"
    --build-arg SOURCE="$source" --build-arg EXTRAS="$EXTRAS")
[ -n "$ca" ] && args+=(--secret "id=ca,src=$ca") && echo "CA bundle for pip: $ca (build secret, not in the image)"
tb=$SECONDS
if [ "$engine" = docker ]; then
    DOCKER_BUILDKIT=1 docker build "${args[@]}" .
    image_id=$(docker image inspect --format '{{.Id}}' "$name")
    size=$(docker image inspect --format '{{.Size}}' "$name" | awk '{printf "%.2f GB", $1 / 1e9}')
else
    buildah bud --layers --isolation chroot --network host --pull=never "${args[@]}" .
    image_id=$(buildah inspect --type image --format '{{.FromImageID}}' "$name")
    size=$(buildah images --format '{{.Size}}' "$name" | head -1)
fi
echo "built $name in $((SECONDS - tb)) s: image ${image_id:0:12}, $size"

# ---- 4. a solve and the MPI smoke tests inside the image ---------------------------------
# docker/smoke.sh runs in one container as the image's user (uid 1000), with a host folder
# mounted at /work/results and the CA bundle at /run/secrets/ca for pip (pytest only).
if [ "${SMOKE:-1}" = 1 ]; then
    step "solving on 2 ranks and running MPI smoke tests inside the image (docker/smoke.sh)"
    smoke=$repo/$out/smoke
    rm -rf "$smoke" && mkdir -p "$smoke" && chmod 0777 "$smoke"
    mounts=(-v "$smoke:/work/results")
    [ -n "$ca" ] && mounts+=(-v "$ca:/run/secrets/ca:ro")
    ts=$SECONDS
    if [ "$engine" = docker ]; then
        docker run --rm "${mounts[@]}" "$name" bash docker/smoke.sh
    else
        ctr=$(buildah from --pull=never "$name")
        trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
        buildah run --isolation chroot --network host "${mounts[@]}" "$ctr" -- bash docker/smoke.sh
        buildah rm "$ctr" >/dev/null && trap - EXIT
    fi
    echo "smoke passed in $((SECONDS - ts)) s; the run's outputs are in $out/smoke/demo"
else
    step "SMOKE=0: no solve in the image"
fi

# ---- 5. the archive -----------------------------------------------------------------------
step "writing $archive (docker load -i)"
if [ -s "$archive" ] && [ "$(cat "$archive.id" 2>/dev/null)" = "$image_id" ]; then
    echo "unchanged: it holds image ${image_id:0:12} already"
else
    rm -f "$archive" "$archive.id"
    ta=$SECONDS
    if [ "$engine" = docker ]; then
        docker save -o "$archive.tmp" "$name"
    else
        buildah push -q "$name" "docker-archive:$archive.tmp:$name" >/dev/null
    fi
    mv "$archive.tmp" "$archive"
    echo "$image_id" > "$archive.id"
    echo "written in $((SECONDS - ta)) s"
fi
echo "$(du -h "$archive" | cut -f1) $archive"

# ---- 6. Apptainer (optional) ----------------------------------------------------------------
step "Apptainer/Singularity conversion (optional)"
apptainer=$(command -v apptainer || command -v singularity || true)
if [ -n "$apptainer" ]; then
    sif=$out/transformer-pde-$version-$lock.sif
    "$apptainer" build --force "$sif" "docker-archive://$archive"
    "$apptainer" exec "$sif" mpiexec -n 2 transformer-pde --version
    echo "$(du -h "$sif" | cut -f1) $sif"
else
    echo "skipped: no apptainer or singularity here (Debian bookworm packages neither; docker/README.md)"
fi

step "done in $((SECONDS - t0)) s"
echo "image:   $name ($engine, $size, revision $revision)"
echo "archive: $archive (docker load -i $archive)"
