# The same image as `make image` (hack/image.sh), for users with a container engine:
#
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) \
#     --build-arg SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) -t IMAGE .      (or: make docker-image)
#
# Same layout: the fully static binary built by hack/build-static.sh at
# /statefulset-scaledown-controller, /etc/passwd and /etc/group from hack/image/, on an empty base
# (no shell, no libc), user 65532:65532, ports 8080 and 8081. tests/e2e_image.rs checks that this
# file and hack/image.sh agree, and runs this file's build stage in a copy of its build context.
FROM docker.io/library/rust:1.95-bookworm AS build
ARG GIT_COMMIT=unknown
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
# The allocator's tuning (jemalloc's malloc_conf, embedded at build time) is cargo configuration:
# without it the binary would differ from the one of `make image`.
COPY .cargo/config.toml ./.cargo/
COPY src ./src
COPY hack/build-static.sh ./hack/
RUN SCALEDOWN_GIT_COMMIT="$GIT_COMMIT" hack/build-static.sh /statefulset-scaledown-controller

FROM scratch
ARG GIT_COMMIT=unknown
ARG SOURCE_DATE_EPOCH=0
COPY hack/image/passwd /etc/passwd
COPY hack/image/group /etc/group
COPY --from=build /statefulset-scaledown-controller /statefulset-scaledown-controller
USER 65532:65532
# --metrics-bind-address (/metrics) and --health-probe-bind-address (/healthz, /readyz)
EXPOSE 8080/tcp 8081/tcp
LABEL org.opencontainers.image.title="statefulset-scaledown-controller" \
      org.opencontainers.image.source="https://github.com/statefulset-scaledown/statefulset-scaledown-controller" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="$GIT_COMMIT"
ENTRYPOINT ["/statefulset-scaledown-controller"]
