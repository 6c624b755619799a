#!/usr/bin/env bash
# The cost of TLS: `simple` over gRPC (unary, one HTTP/2 connection) and over
# HTTP/1.1 (binary tensors, one connection per outstanding request), with
# and without TLS, at concurrency 1 and 64. One server (one shard on
# SERVER_CPU), plaintext and TLS alternated for ROUNDS rounds; shardserve-bench
# on CLIENT_CPU. Connections are opened before the windows, so this is the
# per-request cost of the record layer, not of handshakes. Certificates
# (ECDSA P-256) are made in a temporary folder with `openssl`.
#
# Usage: scripts/bench_tls.sh [WINDOW_MS=2000] [ROUNDS=2] [SERVER_CPU=0] [CLIENT_CPU=1] [PORT=18100]
set -euo pipefail
cd "$(dirname "$0")/.."
window=${1:-2000}
rounds=${2:-2}
server_cpu=${3:-0}
client_cpu=${4:-1}
port=${5:-18100}
bin=target/release/shardserve
bench=target/release/shardserve-bench
out=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT

ossl() { openssl "$@" >/dev/null 2>&1; }
(
  cd "$out"
  ossl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
    -out ca.crt -days 2 -subj /CN=bench-ca -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign
  ossl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key \
    -out server.csr -subj /CN=localhost
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext
  ossl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt \
    -days 2 -extfile server.ext
)

start() { # $1: extra flags
  port=$((port + 3))
  # shellcheck disable=SC2086
  taskset -c "$server_cpu" "$bin" --model-repository models --host 127.0.0.1 \
    --http-port "$port" --grpc-port $((port + 1)) --metrics-port $((port + 2)) \
    --cores 1 $1 >"$out/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    curl -skf "$2://127.0.0.1:$port/v2/health/ready" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "server did not start:"; cat "$out/server.log"; exit 1
}

tls_flags="--grpc-use-ssl=true --grpc-server-cert $out/server.crt --grpc-server-key $out/server.key \
--http-use-ssl=true --http-server-cert $out/server.crt --http-server-key $out/server.key"

run_bench() { # $1: label, rest: bench arguments
  local label=$1; shift
  taskset -c "$client_cpu" "$bench" -m simple --concurrency-range 1,64 -p "$window" \
    --cpu "$client_cpu" -q --no-progress -f "$out/r.csv" "$@" >/dev/null
  awk -F, -v l="$label" 'NR > 1 { printf "%s c=%s infer/s=%.0f p50_us=%s p99_us=%s\n", l, $1, $2, $10, $13 }' \
    "$out/r.csv" | tee -a "$out/all.txt"
}

for r in $(seq 1 "$rounds"); do
  start "" http
  run_bench "round=$r grpc-plain" -i grpc -u "127.0.0.1:$((port + 1))"
  run_bench "round=$r http-plain" -u "127.0.0.1:$port"
  kill -TERM "$pid"; wait "$pid" || true; pid=
  start "$tls_flags" https
  run_bench "round=$r grpc-tls" -i grpc -u "127.0.0.1:$((port + 1))" --ssl-grpc-use-ssl \
    --ssl-grpc-root-certifications-file "$out/ca.crt"
  run_bench "round=$r https" -u "https://127.0.0.1:$port" --ssl-https-ca-certificates-file "$out/ca.crt"
  kill -TERM "$pid"; wait "$pid" || true; pid=
done
