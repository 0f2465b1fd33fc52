# Multi-stage build: a release binary built with the pinned toolchain, run as non-root on a
# distroless base that carries glibc and CA certificates and no shell.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --locked --bin statefulset-scaledown-controller

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/statefulset-scaledown-controller /statefulset-scaledown-controller
USER 65532:65532
# --metrics-bind-address (/metrics) and --health-probe-bind-address (/healthz, /readyz)
EXPOSE 8080 8081
ENTRYPOINT ["/statefulset-scaledown-controller"]
