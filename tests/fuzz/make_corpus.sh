#!/usr/bin/env bash
# Writes the seed corpus, tests/fuzz/corpus/<target>/<seed>, from the text-format messages
# below (protoc --encode) and the targets' input formats (see each fuzz_*.cc):
#   fuzz_request: one byte picking the message, then its serialized bytes;
#   fuzz_stream:  a flags byte, then messages, each a 2-byte little-endian length and its bytes;
#   fuzz_regions: operation bytes;
#   fuzz_session: a flags byte, then framed DeviceSessionRequests (as fuzz_stream's).
# The seeds are checked in; run this after changing it (or the proto) and commit the result.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
readonly ROOT=../..
readonly OUT=corpus

# encode TYPE TEXT: the serialized samplerd.v1.TYPE written as TEXT (text format).
encode() {
  protoc --proto_path="${ROOT}/proto" --encode="samplerd.v1.$1" \
    samplerd/v1/sampler.proto <<<"$2"
}

# byte N: one raw byte.
byte() { printf '%b' "\\x$(printf '%02x' "$1")"; }

# framed TYPE TEXT: a stream message with its 2-byte little-endian length.
framed() {
  local tmp
  tmp="$(mktemp)"
  encode "$1" "$2" >"${tmp}"
  local n
  n="$(stat -c %s "${tmp}")"
  byte $((n & 255))
  byte $((n >> 8))
  cat "${tmp}"
  rm -f "${tmp}"
}

# seed TARGET NAME: stdin becomes the seed.
seed() {
  mkdir -p "${OUT}/$1"
  cat >"${OUT}/$1/$2"
}

# Two rows of four fp32 logits: [1, 2, 0.5, 1] and [2, 1, 1, 0.5] (little-endian bytes).
readonly ROW0='\000\000\200?\000\000\000@\000\000\000?\000\000\200?'
readonly ROW1A='\000\000\000@\000\000\200?' ROW1B='\000\000\200?\000\000\000?'
readonly LOGITS="${ROW0}${ROW1A}${ROW1B}"
readonly TENSOR="logits { dtype: DTYPE_FP32 shape: [2, 4] inline_data: \"${LOGITS}\" }"
readonly GREEDY="request_id: \"g\" ${TENSOR} params { temperature: 0 }"
readonly SAMPLED="request_id: \"s\" ${TENSOR} params { temperature: 0.7 top_k: 3 top_p: 0.9
  min_p: 0.01 seed: 7 top_p_mode: TOP_P_MODE_JOINT } logprobs { top_n: 2
  source: LOGPROB_SOURCE_PROCESSED } row_seeds: [1, 2] row_positions: [3, 4]"
readonly PROCESSORS="request_id: \"p\" ${TENSOR} params { temperature: 1 repetition_penalty: 1.2
  presence_penalty: 0.5 frequency_penalty: 0.1 }
  logit_bias { row_offsets: [0, 1, 2] token_ids: [1, 2] biases: [-inf, 2.5] }
  token_history { row_offsets: [0, 1, 1] token_ids: [3] output_counts: [2] in_prompt: [true] }
  token_bitmask { inline_words: \"\\006\\000\\000\\000\\017\\000\\000\\000\" }"
readonly REGION="request_id: \"r\" logits { dtype: DTYPE_FP32 shape: [2, 4]
  region { region: \"r\" offset: 64 } } output { region: \"r\" offset: 4096 } params { }"
readonly BF16="logits { dtype: DTYPE_BF16 shape: [2, 3] row_stride: 4
  inline_data: \"\\200?\\000@\\000?\\000\\000\\000@\\200?\\200?\" } params { temperature: 0.5 }
  params { temperature: 2 top_k: 1 }"
readonly OPEN="open { dtype: DTYPE_FP32 max_batch: 2 vocab: 16 control { region: \"ctl\" }
  logits { region: \"buf\" } params { region: \"buf\" offset: 256 }
  token_ids { region: \"buf\" offset: 512 } row_status { region: \"buf\" offset: 576 }
  sampled_logprobs { region: \"buf\" offset: 640 } plane: DEVICE_PLANE_HOST }"

rm -rf "${OUT}"

# fuzz_request: 0 SampleRequest, 1 SampleStreamRequest, 2 RegisterRegionRequest,
# 3 UnregisterRegionRequest, 4 DeviceSessionRequest, 5 the empty requests.
{ byte 0; encode SampleRequest "${GREEDY}"; } | seed fuzz_request sample-greedy
{ byte 0; encode SampleRequest "${SAMPLED}"; } | seed fuzz_request sample-filters
{ byte 0; encode SampleRequest "${PROCESSORS}"; } | seed fuzz_request sample-processors
{ byte 0; encode SampleRequest "${REGION}"; } | seed fuzz_request sample-region
{ byte 0; encode SampleRequest "${BF16}"; } | seed fuzz_request sample-bf16-strided
{ byte 1; encode SampleStreamRequest "request { ${GREEDY} } more_chunks: true"; } |
  seed fuzz_request stream-step
{ byte 2; encode RegisterRegionRequest 'name: "x" host_shm { key: "%obj1" offset: 4096
  byte_size: 4096 }'; } | seed fuzz_request register-shm
{ byte 2; encode RegisterRegionRequest 'name: "y" gpu_ipc { memory_handle: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
  byte_size: 64 device: "0000:00:06.0" }'; } | seed fuzz_request register-ipc
{ byte 3; encode UnregisterRegionRequest 'name: "x"'; } | seed fuzz_request unregister
{ byte 4; encode DeviceSessionRequest "${OPEN}"; } | seed fuzz_request session-open
{ byte 5; } | seed fuzz_request empty

# fuzz_stream: flags (bit 0: regions allowed), then framed SampleStreamRequests.
{ byte 0; framed SampleStreamRequest "request { ${GREEDY} }"
  framed SampleStreamRequest "request { ${SAMPLED} }"; } | seed fuzz_stream two-steps
{ byte 0; framed SampleStreamRequest "request { request_id: \"c\" logits { dtype: DTYPE_FP32
    shape: [2, 4] inline_data: \"${ROW0}\" } } more_chunks: true"
  framed SampleStreamRequest "chunk: \"${ROW1A}\" more_chunks: true"
  framed SampleStreamRequest "chunk: \"${ROW1B}\""; } | seed fuzz_stream chunked
{ byte 0; framed SampleStreamRequest "request { ${PROCESSORS} }"
  byte 2; byte 0; printf '\377\377'
  framed SampleStreamRequest "request { ${GREEDY} }"; } | seed fuzz_stream unparsable-middle
{ byte 1; framed SampleStreamRequest "request { ${REGION} }"
  framed SampleStreamRequest "chunk: \"x\""; } | seed fuzz_stream region-then-stray-chunk

# fuzz_regions: operations (fuzz_regions.cc, Run::Step): 0 register host shm, 1 register GPU
# IPC, 2 acquire, 3 release a lease, 4 unregister, 5 list, 6 release every lease.
# Register "a" as all of object 2 (64 KiB); lease 4096 bytes at 0; unregister while leased;
# list; release.
printf '\x00\x00\x02\x00\x12\x02\x00\x00\x05\x00\x10\x04\x00\x05\x03\x00' |
  seed fuzz_regions host-lease-unregister
# Register "b" as GPU IPC (8 KiB at 0, by PCI bus id), then by PyTorch's 66-byte form as "c";
# lease the last byte of "b"; list; unregister both.
printf '\x01\x01\x00\x00\x00\x05\x00\x20\x01\x02\x64\x00\x00\x05\x00\x10\x02\x01\x05\xff\x1f\x01\x05\x04\x01\x04\x02' |
  seed fuzz_regions ipc-forms
# Offsets and sizes whose sum overflows, an unknown key under the prefix, a bad name.
printf '\x00\x00\x00\x03\x0a\x00\x03\xd0\x02ab\x00\x00\x00\xf5\x02a/\x00\x00\x02\x02\x00\x03\x03' |
  seed fuzz_regions overflow-and-bad-keys
# fuzz_session: flags (fuzz_session.cc: bit 0 regions allowed, 1 ring a step, 2 writes fail,
# bits 3-4 drain before read N, 5 no sessions allowed, 6 the rung step's params valid), then
# framed DeviceSessionRequests.
readonly CLOSE='close { }'
{ byte 1; framed DeviceSessionRequest "${OPEN}"; framed DeviceSessionRequest "${CLOSE}"; } |
  seed fuzz_session open-close
{ byte 3; framed DeviceSessionRequest "${OPEN}"; } | seed fuzz_session open-ring-half-close
{ byte $((1 | 2 | 64)); framed DeviceSessionRequest "${OPEN}"
  framed DeviceSessionRequest "${CLOSE}"; } | seed fuzz_session ring-sampled-close
{ byte 7; framed DeviceSessionRequest "${OPEN%\}} unregister_regions_on_end: true }"
  framed DeviceSessionRequest "${CLOSE}"; } | seed fuzz_session unregister-writes-fail
{ byte 1; framed DeviceSessionRequest "${OPEN}"; framed DeviceSessionRequest "${OPEN}"; } |
  seed fuzz_session second-open
{ byte 1; framed DeviceSessionRequest "${OPEN/PLANE_HOST/PLANE_GPU}"; } | seed fuzz_session gpu-plane
{ byte 1; framed DeviceSessionRequest "${CLOSE}"; } | seed fuzz_session close-first
{ byte $((1 | 2 << 3)); framed DeviceSessionRequest "${OPEN}"
  framed DeviceSessionRequest "${CLOSE}"; } | seed fuzz_session drain-while-open
{ byte 0; framed DeviceSessionRequest "${OPEN}"; } | seed fuzz_session remote-peer
echo "corpus: $(find "${OUT}" -type f | wc -l) seeds, $(du -sb "${OUT}" | cut -f1) bytes"
