# Build: the release binary, with templates, static files and migrations compiled in.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
# The checked queries' descriptions: `sqlx::query!` needs them without a database to ask.
COPY .sqlx .sqlx
COPY src src
COPY templates templates
COPY static static
COPY migrations migrations
RUN cargo build --release --locked

# Run: a small image with just the binary.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home stockade
COPY --from=build /src/target/release/stockade /usr/local/bin/stockade
USER stockade
ENV STOCKADE_LISTEN=0.0.0.0:8080 STOCKADE_LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD curl -fsS http://127.0.0.1:8080/readyz || exit 1
CMD ["stockade", "serve"]
