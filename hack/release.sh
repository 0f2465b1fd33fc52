#!/usr/bin/env bash
# `make release`: publishes the image `make image` built (target/image/oci) and the Helm chart to an
# OCI registry, signed with a cosign key pair.
#
#   hack/release.sh
#
# VERSION is Cargo.toml's. What it pushes, for REGISTRY (default ghcr.io/statefulset-scaledown):
#   REGISTRY/statefulset-scaledown-controller:VERSION        the image of target/image/oci's tag VERSION
#     + a cosign signature (key pair, no transparency log) of the image's digest
#     + a signed CycloneDX attestation: the SBOM hack/image.sh wrote
#       (target/image/statefulset-scaledown-controller.cdx.json) as the predicate of an in-toto
#       statement about the image's digest (`cosign attest --type cyclonedx`); `cosign
#       verify-attestation --type cyclonedx` checks its signature and returns the SBOM
#   oci://REGISTRY/charts/statefulset-scaledown-controller:VERSION   the chart (version and
#       appVersion VERSION), its image pinned by digest (image.repository REGISTRY/..., image.digest),
#       + a cosign signature of the chart's digest
#
# Signing key: COSIGN_KEY (a cosign private key file, or a KMS URI cosign takes) with its password in
# COSIGN_PASSWORD. Without COSIGN_KEY the pair target/signing/cosign.key and .pub is used, generated
# on first use with a random password kept in target/signing/cosign.password (mode 0600). Nothing
# asks on the terminal. The tools are built from their Go modules (hack/build-tools.sh crane, cosign,
# helm). Log in to the registry first (crane auth login and helm registry login; cosign reads the
# same ~/.docker/config.json).
#
# Environment:
#   REGISTRY              registry and path prefix (default ghcr.io/statefulset-scaledown)
#   RELEASE_PLAIN_HTTP=1  the registry speaks plain HTTP (a local one, as tests/e2e_release.rs uses)
#   COSIGN_KEY, COSIGN_PASSWORD   as above
#   COSIGN_KEYLESS=1      sign keyless instead (cosign's OIDC flow; the release workflow's identity)
#   RELEASE_ARCHS         e.g. "amd64 arm64": do not push target/image/oci; VERSION becomes the index
#                         of the images already pushed as VERSION-ARCH (the release workflow builds
#                         each on a runner of its architecture), each attested with
#                         RELEASE_SBOM_DIR/ARCH.cdx.json
#
# Output: target/dist/statefulset-scaledown-controller-VERSION.tgz (the chart as pushed) and
# target/dist/release.env (VERSION, IMAGE, IMAGE_DIGEST, CHART, CHART_DIGEST, COSIGN_PUB,
# COSIGN_TRUSTED_ROOT), and the same on stdout.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
registry=${REGISTRY:-ghcr.io/statefulset-scaledown}
registry=${registry%/}
plain=${RELEASE_PLAIN_HTTP:-0}
log() { printf '[release] %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
t0=$SECONDS

crane=$("$root/hack/build-tools.sh" crane | tail -n 1)
cosign=$("$root/hack/build-tools.sh" cosign | tail -n 1)
helm=$("$root/hack/build-tools.sh" helm | tail -n 1)

cd "$root"
version=$(cargo metadata --locked --no-deps --format-version 1 |
  jq -r '.packages[] | select(.name == "statefulset-scaledown-controller") | .version')
name=statefulset-scaledown-controller
repository="$registry/$name"
chart_repo="$registry/charts"
layout="$root/target/image/oci"
sbom="$root/target/image/$name.cdx.json"
dist="$root/target/dist"
[[ -n "${RELEASE_ARCHS:-}" || (-s "$layout/index.json" && -s "$sbom") ]] || die "no image at $layout (run make image first)"
one=$(mktemp -d)
trap 'rm -rf "$one"' EXIT

crane_flags=()
cosign_flags=()
helm_flags=()
if [[ "$plain" == 1 ]]; then
  crane_flags=(--insecure)
  cosign_flags=(--allow-http-registry --allow-insecure-registry)
  helm_flags=(--plain-http)
fi
# Key-pair signatures are kept in the registry only: no transparency log, nothing fetched from the
# public Sigstore instance. COSIGN_KEYLESS=1 (the release workflow):
# a Fulcio certificate for the CI host's OIDC identity, recorded in Rekor.
# The signatures are Sigstore bundles, attached to the image as OCI referrers (cosign's default).
if [[ "${COSIGN_KEYLESS:-0}" == 1 ]]; then
  sign_flags=(--yes)
else
  # A signing config without any service: no certificate authority, transparency log or
  # timestamp authority is asked (`cosign verify --key K --insecure-ignore-tlog=true` checks the
  # signatures, with --trusted-root target/signing/trusted-root.json to stay offline).
  signing_config="$root/target/signing/signing-config.json"
  mkdir -p "${signing_config%/*}"
  jq -n '{mediaType: "application/vnd.dev.sigstore.signingconfig.v0.2+json", caUrls: [], oidcUrls: [],
    rekorTlogUrls: [], tsaUrls: [], rekorTlogConfig: {selector: "ANY"}, tsaConfig: {selector: "ANY"}}' >"$signing_config"
  # And a trusted root without any authority, so cosign does not fetch the public one (TUF).
  trusted_root="$root/target/signing/trusted-root.json"
  jq -n '{mediaType: "application/vnd.dev.sigstore.trustedroot+json;version=0.1", tlogs: [],
    certificateAuthorities: [], ctlogs: [], timestampAuthorities: []}' >"$trusted_root"
  sign_flags=(--yes --signing-config "$signing_config" --trusted-root "$trusted_root")
fi

# --- the key pair ------------------------------------------------------------------------------
signing_key() {
  key_flags=()
  pub=
  [[ "${COSIGN_KEYLESS:-0}" != 1 ]] || return 0
  if [[ -n "${COSIGN_KEY:-}" ]]; then
    [[ -n "${COSIGN_PASSWORD+set}" ]] || die "COSIGN_KEY is set but COSIGN_PASSWORD is not"
    key=$COSIGN_KEY
    pub=${COSIGN_KEY%.key}.pub
    export COSIGN_PASSWORD
    return
  fi
  local dir="$root/target/signing"
  key="$dir/cosign.key"
  pub="$dir/cosign.pub"
  if [[ ! -s "$key" ]]; then
    mkdir -p "$dir"
    (umask 077 && head -c 24 /dev/urandom | base64 >"$dir/cosign.password")
    rm -f "$key" "$pub"
    (cd "$dir" && COSIGN_PASSWORD=$(cat "$dir/cosign.password") "$cosign" generate-key-pair \
      --output-key-prefix cosign >/dev/null)
    log "generated the key pair $key (password in $dir/cosign.password)"
  fi
  COSIGN_PASSWORD=$(cat "$dir/cosign.password")
  export COSIGN_PASSWORD
}
signing_key
if [[ -n "$pub" ]]; then key_flags=(--key "$key"); fi


# --- the image ---------------------------------------------------------------------------------
# Sets digest (what the chart pins and what is signed) and attest (DIGEST=SBOM pairs: each platform
# image with its own SBOM).
push_layout() {
  # crane push takes a layout of one image: VERSION's entry of the index.
  cp -r "$layout/." "$one/"
  jq --arg tag "$version" '.manifests |= map(select(.annotations["org.opencontainers.image.ref.name"] == $tag))' \
    "$layout/index.json" >"$one/index.json"
  [[ "$(jq '.manifests | length' "$one/index.json")" == 1 ]] ||
    die "no image tagged $version in $layout (make image tags Cargo.toml's version)"
  digest=$(jq -r '.manifests[0].digest' "$one/index.json")
  "$crane" push "${crane_flags[@]}" "$one" "$repository:$version" >&2
  attest=("$digest=$sbom")
}

# The release workflow: the platform images are already pushed as VERSION-ARCH, each built on its
# own runner, and their SBOMs are in RELEASE_SBOM_DIR/ARCH.cdx.json; VERSION becomes their index.
push_index() {
  local arch args=() d
  attest=()
  for arch in $RELEASE_ARCHS; do
    args+=(-m "$repository:$version-$arch")
    d=$("$crane" digest "${crane_flags[@]}" "$repository:$version-$arch")
    attest+=("$d=${RELEASE_SBOM_DIR:?RELEASE_SBOM_DIR is needed with RELEASE_ARCHS}/$arch.cdx.json")
  done
  "$crane" index append "${crane_flags[@]}" "${args[@]}" -t "$repository:$version" >&2
  digest=$("$crane" digest "${crane_flags[@]}" "$repository:$version")
}

if [[ -n "${RELEASE_ARCHS:-}" ]]; then push_index; else push_layout; fi
pushed=$("$crane" digest "${crane_flags[@]}" "$repository:$version")
[[ "$pushed" == "$digest" ]] || die "$repository:$version is $pushed after the push, not $digest"
image="$repository@$digest"
log "pushed $repository:$version ($digest)"

# --recursive: an index's platform images are signed too.
"$cosign" sign "${cosign_flags[@]}" "${sign_flags[@]}" "${key_flags[@]}" --recursive \
  -a "org.opencontainers.image.version=$version" "$image" >&2
for pair in "${attest[@]}"; do
  "$cosign" attest "${cosign_flags[@]}" "${sign_flags[@]}" "${key_flags[@]}" \
    --type cyclonedx --predicate "${pair#*=}" "$repository@${pair%%=*}" >&2
done
log "signed $image and attached its SBOM as a signed CycloneDX attestation"

# --- the chart ---------------------------------------------------------------------------------
src="$one/chart/$name"
mkdir -p "$src" "$dist"
cp -r "$root/charts/$name/." "$src/"
sed -i -e "s|^  repository: ghcr.io/statefulset-scaledown/$name\$|  repository: $repository|" \
  -e "s|^  digest: \"\"\$|  digest: \"$digest\"|" "$src/values.yaml"
sed -i -e "s|image: ghcr.io/statefulset-scaledown/$name:.*\$|image: $image|" "$src/Chart.yaml"
rendered=$("$helm" template release "$src" --show-only templates/deployment.yaml | sed -n 's/^ *image: *//p')
[[ "$rendered" == "$image" || "$rendered" == "\"$image\"" ]] ||
  die "the packaged chart renders image '$rendered', not $image"
rm -f "$dist/$name-$version.tgz"
"$helm" package "$src" --version "$version" --app-version "$version" -d "$dist" >&2
chart_out=$("$helm" push "$dist/$name-$version.tgz" "oci://$chart_repo" "${helm_flags[@]}" 2>&1) ||
  die "helm push failed: $chart_out"
chart_digest=$(sed -n 's/^Digest: *//p' <<<"$chart_out")
[[ "$chart_digest" == sha256:* ]] || die "no digest in helm push's output: $chart_out"
"$cosign" sign "${cosign_flags[@]}" "${sign_flags[@]}" "${key_flags[@]}" "$chart_repo/$name@$chart_digest" >&2
log "pushed and signed oci://$chart_repo/$name:$version ($chart_digest)"

cat >"$dist/release.env" <<EOF
VERSION=$version
IMAGE=$repository:$version
IMAGE_DIGEST=$digest
CHART=oci://$chart_repo/$name
CHART_DIGEST=$chart_digest
COSIGN_PUB=$pub
COSIGN_TRUSTED_ROOT=${trusted_root:-}
EOF
cat "$dist/release.env"
echo "[timing] release: $((SECONDS - t0)) s"
