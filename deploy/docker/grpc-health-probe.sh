#!/usr/bin/env bash
# A gRPC health check (grpc.health.v1.Health/Check) in plain bash, for the images' HEALTHCHECK:
#
#   grpc-health-probe.sh [HOST:PORT] [SERVICE]     defaults: 127.0.0.1:8081, "" (the whole server)
#
# Exit 0 and prints SERVING when the server answers SERVING; exit 1 otherwise (NOT_SERVING, an
# error status such as NOT_FOUND for an unknown service, no answer within 3 s, or no connection).
#
# Why this exists: Debian ships no grpc_health_probe, and the runtime images carry no curl or
# Python. Kubernetes does not use it (kubelet has native gRPC probes, see deploy/k8s); it serves
# `docker run` and other runtimes that honour HEALTHCHECK. It speaks HTTP/2 with prior knowledge
# (h2c, no TLS) through bash's /dev/tcp: the connection preface, an empty SETTINGS frame, one
# HEADERS frame (HPACK literals, no Huffman coding) and one DATA frame carrying the request, then
# it reads until the response message appears. Tested against the real server by
# tests/deploy/check.sh.
set -uo pipefail

readonly TARGET="${1:-127.0.0.1:8081}"
readonly SERVICE="${2:-}"
readonly HOST="${TARGET%:*}" PORT="${TARGET##*:}"

# Prints the bytes of $1 as \xHH escapes (for printf %b).
hex_escape() {
  local s="$1" i out=""
  for ((i = 0; i < ${#s}; i++)); do out+="$(printf '\\x%02x' "'${s:i:1}")"; done
  printf '%s' "${out}"
}
# An HPACK string of at most 127 bytes: its length, then the raw bytes (no Huffman coding).
hpack_string() { printf '\\x%02x%s' "${#1}" "$(hex_escape "$1")"; }
# An HTTP/2 frame header: 24-bit payload length, type, flags, stream id 1 (0 for SETTINGS).
frame_header() {  # LENGTH TYPE FLAGS STREAM
  printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x%02x' \
    $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)) "$2" "$3" "$4"
}

((${#SERVICE} <= 120)) || { echo "service name too long" >&2; exit 1; }

# Header block: :method POST (static 3), :scheme http (static 6), then literals without
# indexing: :path (name 4), :authority (name 1), content-type (name 31: 0x0f 0x10), te: trailers.
headers='\x83\x86'
headers+="\\x04$(hpack_string /grpc.health.v1.Health/Check)"
headers+="\\x01$(hpack_string "${TARGET}")"
headers+="\\x0f\\x10$(hpack_string application/grpc)"
headers+="\\x00$(hpack_string te)$(hpack_string trailers)"
headers_len=$(printf '%b' "${headers}" | wc -c)

# HealthCheckRequest{service}: field 1, length-delimited; empty for the whole server.
message=""
((${#SERVICE} > 0)) && message="\\x0a$(hpack_string "${SERVICE}")"
message_len=$(printf '%b' "${message}" | wc -c)
# gRPC length-prefixed message: not compressed, 32-bit big-endian length.
data="\\x00\\x00\\x00\\x00$(printf '\\x%02x' "${message_len}")${message}"

# (The group keeps bash's own "connection refused" message off stderr; fd 3 stays open.)
if ! { exec 3<>"/dev/tcp/${HOST}/${PORT}"; } 2>/dev/null; then
  echo "cannot connect to ${TARGET}" >&2
  exit 1
fi
{
  printf 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'
  printf '%b' "$(frame_header 0 4 0 0)"                                 # SETTINGS, empty
  printf '%b' "$(frame_header "${headers_len}" 1 4 1)${headers}"        # HEADERS, END_HEADERS
  printf '%b' "$(frame_header $((5 + message_len)) 0 1 1)${data}"       # DATA, END_STREAM
} >&3

# The answer is a DATA frame whose gRPC message is HealthCheckResponse{status}: 00, length 2,
# then field 1 varint: 08 01 = SERVING, 08 02 = NOT_SERVING, 08 03 = SERVICE_UNKNOWN. An error
# status (e.g. NOT_FOUND for an unknown service) arrives as trailers only, without a message: a
# HEADERS frame on stream 1 with END_STREAM and END_HEADERS (type 01, flags 05).
seen=""
for _ in $(seq 30); do
  seen+=" $(timeout 0.1 dd bs=65536 count=1 status=none <&3 | od -An -v -tx1)"
  # All bytes so far as " hh hh ... hh ", so that a pattern split across reads still matches.
  read -r -a bytes <<<"${seen//$'\n'/ }"
  case " ${bytes[*]} " in
    *" 00 00 00 00 02 08 01 "*) echo SERVING; exit 0 ;;
    *" 00 00 00 00 02 08 02 "*) echo NOT_SERVING; exit 1 ;;
    *" 00 00 00 00 02 08 03 "*) echo SERVICE_UNKNOWN; exit 1 ;;
    *" 01 05 00 00 00 01 "*)
      echo "error status from ${TARGET} for service '${SERVICE}'" >&2
      exit 1
      ;;
  esac
done
echo "no health answer from ${TARGET} for service '${SERVICE}'" >&2
exit 1
