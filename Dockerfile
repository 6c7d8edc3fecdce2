# wasmbox in a container: the binary, its runtimes (`wasmbox setup`) and their compiled images
# (`wasmbox prepare`) baked in, so the first call is warm. Build: docker build -t wasmbox .
# Claude Desktop: {"command": "docker", "args": ["run", "-i", "--rm", "wasmbox"]}
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin wasmbox && strip target/release/wasmbox

FROM debian:bookworm-slim
# CA roots for the runtimes' download, the package index and the HOPX API.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 wasmbox
COPY --from=build /src/target/release/wasmbox /usr/local/bin/wasmbox
USER wasmbox
WORKDIR /home/wasmbox
ENV WASMBOX_RUNTIMES=/home/wasmbox/runtimes \
    WASMBOX_CACHE=/home/wasmbox/cache
RUN wasmbox setup && wasmbox prepare
# Persistent sandboxes live in ~/.local/share/wasmbox: mount a volume there to keep them.
ENTRYPOINT ["wasmbox"]
CMD ["serve"]
