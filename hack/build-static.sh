#!/usr/bin/env bash
# Builds the controller (or another binary of the crate) as one fully static executable (glibc with
# crt-static: no loader, no shared library, so it runs on an empty base image) and copies it to
# $1. Used by `make image` (hack/image.sh) and by the Dockerfile, so both images carry the same
# binary built the same way, and by `make krew` (hack/krew.sh) for the plugin's archive.
#
#   hack/build-static.sh OUT [BIN]     BIN: statefulset-scaledown-controller (default) or kubectl-scaledown
#
# Reproducible: paths of the checkout and of Cargo's home are remapped, so the same commit built in
# another directory gives the same bytes. The commit printed by `--version` comes from
# SCALEDOWN_GIT_COMMIT (else build.rs asks git).
set -euo pipefail

out=${1:?usage: $0 OUT [BIN]}
bin_name=${2:-statefulset-scaledown-controller}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cargo_home=${CARGO_HOME:-$HOME/.cargo}
target=$(rustc -vV | sed -n 's/^host: //p')
case "$target" in
*-linux-gnu) ;;
*)
  echo "build-static: host $target is not a *-linux-gnu target" >&2
  exit 1
  ;;
esac

# --target keeps RUSTFLAGS off build scripts and proc macros (they cannot be static).
# SOURCE_DATE_EPOCH is kept from cargo: the cc crate (ring, psm) reruns its build scripts when it
# changes, which would rebuild everything after each commit; the binary does not depend on it.
env -u SOURCE_DATE_EPOCH RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$root=/src --remap-path-prefix=$cargo_home=/cargo" \
  cargo build --locked --release --target "$target" --bin "$bin_name" \
  --manifest-path "$root/Cargo.toml"
bin="${CARGO_TARGET_DIR:-$root/target}/$target/release/$bin_name"
if readelf -lW "$bin" | grep -q 'Requesting program interpreter'; then
  echo "build-static: $bin is dynamically linked" >&2
  exit 1
fi
install -m 0755 "$bin" "$out"
