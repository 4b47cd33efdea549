#!/usr/bin/env bash
# Build the CPU image (docker/Dockerfile) with Podman, then check, inside it, that the jail holds:
#   1. with /proc masked (a container's default), `rollout env check` refuses and says what to unmask;
#   2. with the pod security docs/deploy.md names, `rollout env check coding.environment:environment` plays the
#      coding task jailed (its grader included) to a reward;
#   3. scripts/image_jail_check.py's attacks, from a command seat's jail on the image's interpreter, are all
#      refused.
#
# Usage: scripts/build_images.sh [TAG]        (TAG: localhost/rollout:dev by default)
# Settings (environment):
#   BASE_IMAGE      the Debian trixie image to build on (debian:trixie-slim). Where it cannot be pulled, it is
#                   built from Debian's own packages with mmdebstrap and imported as localhost/debian:trixie-slim.
#   PODMAN_RUNTIME  the OCI runtime (runc: crun fails where cgroups are hybrid).
#   EXTRA_CA_CERTS  a folder of *.crt certificates the build trusts (a TLS-inspecting proxy's); by default
#                   /usr/local/share/ca-certificates where it holds any. The image itself does not trust them.
#   UV_CACHE        the host's uv cache, shared with the build (~/.cache/uv where it exists).
# Needs root (rootful Podman). Takes 5 to 10 minutes from nothing; most of it is downloading the locked wheels.
set -euo pipefail

tag=${1:-localhost/rollout:dev}
root=$(cd "$(dirname "$0")/.." && pwd)
runtime=${PODMAN_RUNTIME:-runc}
base=${BASE_IMAGE:-debian:trixie-slim}
nofile=$(ulimit -Hn)
limits=(--ulimit "nofile=${nofile}:${nofile}" --ulimit nproc=4096:4096)
started=$SECONDS

step() { printf '\n== %s (%ss)\n' "$1" "$((SECONDS - started))"; }

step "base image: $base"
if ! podman image exists "$base" && ! timeout 120 podman pull "$base" 2>/dev/null; then
    base=localhost/debian:trixie-slim
    if ! podman image exists "$base"; then
        command -v mmdebstrap >/dev/null || {
            echo "neither $base nor mmdebstrap (apt-get install mmdebstrap) is here to build a base from" >&2
            exit 1
        }
        tarball=$(mktemp --suffix .tar)
        mmdebstrap --quiet --variant=minbase --include=ca-certificates trixie "$tarball" \
            http://deb.debian.org/debian
        podman import "$tarball" "$base" >/dev/null
        rm -f "$tarball"
    fi
fi

step "build $tag"
build=(--runtime "$runtime" "${limits[@]}" --format docker --build-arg "BASE_IMAGE=$base")
certs=${EXTRA_CA_CERTS:-/usr/local/share/ca-certificates}
if compgen -G "$certs/*.crt" >/dev/null; then
    build+=(--volume "$certs:/run/extra-ca-certs:ro" --build-arg EXTRA_CA_CERTS=/run/extra-ca-certs)
fi
cache=${UV_CACHE:-$HOME/.cache/uv}
if [ -d "$cache" ]; then
    build+=(--volume "$cache:/root/.cache/uv")
fi
podman build "${build[@]}" -f "$root/docker/Dockerfile" -t "$tag" "$root"

# What the jail needs of its container (docs/deploy.md, "Pod security for the jail"): a seccomp profile that
# lets bubblewrap make namespaces and name its UTS one (Podman's default refuses sethostname), and an unmasked
# /proc, so that it can mount one of its own. Nothing privileged, no added capability.
run=(podman run --rm --runtime "$runtime" "${limits[@]}" --health-cmd none --security-opt seccomp=unconfined)
jailed=(--security-opt "unmask=/proc/*")

step "the jail refuses a masked /proc, saying what to unmask"
if refused=$("${run[@]}" "$tag" env check coding.environment:environment 2>&1); then
    echo "rollout env check ran with /proc masked: the jail cannot have been in force" >&2
    exit 1
fi
grep -q "procMount: Unmasked" <<<"$refused" || {
    echo "the refusal does not say what to unmask:" >&2
    echo "$refused" >&2
    exit 1
}
echo "refused, as it should be: $(grep -o 'bubblewrap cannot mount a /proc of its own here' <<<"$refused")"

step "rollout env check coding.environment:environment, jailed"
"${run[@]}" "${jailed[@]}" "$tag" env check coding.environment:environment

step "the policy's attacks from a command seat's jail"
"${run[@]}" "${jailed[@]}" --volume "$root/scripts/image_jail_check.py:/checks/image_jail_check.py:ro" \
    --entrypoint /opt/rollout/bin/python "$tag" /checks/image_jail_check.py

step "done: $tag builds and its jail holds"
podman image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' "$tag"
