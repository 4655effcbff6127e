# syntax=docker/dockerfile:1
# The bulkhead image: one static binary (musl, rustls with ring: no OpenSSL, no libc at
# run time) on distroless "static" (CA certificates, /etc/passwd with nonroot, no shell).
# Every subcommand is in it: the chart runs `bulkhead hub`, `bulkhead join
# --install-agent` runs `bulkhead agent`.
#
#   docker build -t bulkhead:0.1.0 .
#
# Not built on the development machine (it has no container engine); see
# docs/operations.md ("Image").

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
# ring compiles a little C and assembly: musl-gcc for the musl target.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY e2e ./e2e
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target x86_64-unknown-linux-musl -p bulkhead --bin bulkhead \
 && install -D -m 0755 target/x86_64-unknown-linux-musl/release/bulkhead /out/bulkhead

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/bulkhead /usr/local/bin/bulkhead
# distroless' nonroot user; the chart's securityContext asks for the same ids.
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["/usr/local/bin/bulkhead"]
CMD ["hub"]
