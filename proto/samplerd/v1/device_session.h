/* samplerd device sessions: the memory layout and the per-step protocol (API v1).
 *
 * A device session (SamplerService.DeviceSession in sampler.proto) is a per-step data plane with
 * no RPC per step. The engine owns five buffers (and up to three optional ones), registers them as
 * regions (RegisterRegion) and names them in DeviceSessionOpen. Each step is then a handful of
 * operations on the engine's own GPU stream; the gRPC stream only opens, holds and closes the
 * session.
 *
 * This header is plain C (C99 and C++), with no dependencies, so that an engine in any language
 * can be written from it and sampler.proto alone. All integers are little-endian.
 *
 * Two optional buffers (token_bitmask, processors) carry logits processors; a session opened
 * without them samples exactly as before they existed.
 *
 * The control block is always host shared memory (a host shm region), in both planes: the
 * engine pins it (cudaHostRegister / hipHostRegister, mapped) and its stream writes and waits
 * on it through the device pointer of that registration; the server polls it on the host.
 * The server never parks a GPU stream on a wait: on the H200 a parked wait blocked every
 * device-wide synchronisation in the server process (cudaFree, IPC opens) until the engine
 * rang, so one idle engine could stall every other client of the server.
 *
 * Planes. Where the data buffers (all but the control block) live decides who samples:
 *   GPU plane:  they are GPU memory (GPU IPC regions on the server's GPU). When the doorbell
 *               rings, the server enqueues the GPU kernels and a stream write of done on its
 *               own stream. The engine's side is stream memory operations only, capturable in a
 *               CUDA graph.
 *   host plane: they are host shared memory (host shm regions). The engine copies its logits
 *               and parameters into them on its own stream (pinned like the control block),
 *               rings, and its stream waits on the done flag. The server's CPU threads sample.
 *               The GPU never switches to the server's context: the cheapest plane for small
 *               batches without MPS.
 *
 * Buffers (each one a RegionSlice of DeviceSessionOpen; M = max_batch, V = vocab, S = row
 * stride in elements, S >= V):
 *   control     SAMPLERD_CONTROL_BYTES, aligned to 64, host shm: struct samplerd_control below.
 *   logits      [M, S] elements of the session's dtype, aligned to the element size.
 *   params      samplerd_params_bytes(M), aligned to 8: per-row parameters, one array per field
 *               (struct of arrays, so that an engine copies its per-field tensors as they are):
 *               offset 0        uint64  seed[M]         Philox key of the row
 *               offset  8*M     uint64  position[M]     Philox counter of the row
 *               offset 16*M     float   temperature[M]  >= 0; < 1e-5 (compared in float32) = greedy
 *               offset 20*M     int32   top_k[M]        0 or -1 = off; < -1 invalid
 *               offset 24*M     float   top_p[M]        (0, 1]; 1 = off
 *               offset 28*M     float   min_p[M]        [0, 1]; 0 = off
 *               offset 32*M     int32   top_p_mode[M]   TopPMode: 0 or 1 = TOP_K_FIRST, 2 = JOINT
 *               The semantics are SamplingParams' (sampler.proto). There is no server-chosen
 *               seed: the engine always supplies seed and position.
 *   token_ids   int32[M], aligned to 4: the sampled token of row i, or -1.
 *   row_status  int32[M], aligned to 4: RowStatus values of sampler.proto (1 = OK, 2 = NaN in
 *               the row, 3 = every logit -inf, 4 = invalid parameters or processors, 5 = no
 *               token allowed after the processors).
 *   sampled_logprobs (optional) float[M], aligned to 4: the sampled token's logprob, from the
 *               source named in DeviceSessionOpen.logprob_source; -inf for invalid rows.
 *   token_bitmask (optional) int32 words [M, W], W = ceil(V / 32), aligned to 4: the
 *               allowed-token bitmask (xgrammar's and vLLM's layout): bit t % 32 of word t / 32
 *               of row i set = token t allowed; bits past V are ignored. With it, every step
 *               applies row i's mask (write all ones for an unconstrained row).
 *   processors  (optional) samplerd_processors_bytes(M, NB, NH), aligned to 4, with
 *               NB = DeviceSessionOpen.logit_bias_capacity and NH = token_history_capacity
 *               (entries over all rows; the whole buffer at most the server's
 *               max_message_bytes, else the open is RESOURCE_EXHAUSTED): the per-row
 *               penalties, the packed logit-bias lists and the packed token histories
 *               (processors.proto's LogitBias / TokenHistory semantics), at the
 *               samplerd_processors_*_offset(M, NB, NH) offsets:
 *                 float   repetition_penalty[M]   finite, > 0; 1 = off
 *                 float   presence_penalty[M]     [-2, 2]; 0 = off
 *                 float   frequency_penalty[M]    [-2, 2]; 0 = off
 *                 uint32  bias_row_offsets[M + 1] row i's bias entries are
 *                                                 [bias_row_offsets[i], bias_row_offsets[i + 1])
 *                 int32   bias_token_ids[NB]      in [0, V), strictly increasing within a row
 *                 float   biases[NB]              any float but NaN (+-inf force / ban)
 *                 uint32  history_row_offsets[M + 1]   likewise for the history entries
 *                 int32   history_token_ids[NH]   in [0, V), strictly increasing within a row
 *                 uint32  history_output_counts[NH]    the token's count in the row's output
 *                 uint8   history_in_prompt[NH]   0 or 1: the token is in the row's prompt
 *               Row i's lists are valid when off[i] <= off[i + 1] <= capacity (for each list),
 *               and, taken in row order, the merged entries of the valid rows up to i number at
 *               most NB + NH (which fails only where rows' ranges overlap, next to a row whose
 *               offsets decrease). Write every row's penalties and offsets each step (1, 0, 0
 *               and off[i] = off[i + 1] for a row without any).
 * No two buffers may overlap. Only rows [0, B) of a step are read or written.
 *
 * Logits processors (token_bitmask, processors): per row, before temperature and every filter,
 * exactly as SampleRequest's (processors.proto): x[t] += bias; then the penalties on the row's
 * history entries (repetition: x > 0 ? x / r : x * r for a token in the prompt or output;
 * x -= frequency * count + presence * (count > 0), in float32 as written); then the bitmask
 * (a clear bit makes the token -inf). A row whose processors break a rule above (offsets out of
 * order or past the capacity, a token id outside [0, V) or not strictly increasing, a NaN bias,
 * an in_prompt other than 0 or 1, a penalty out of range) gets ROW_STATUS 4 and token -1; a row
 * with finite logits but none allowed after the processors gets ROW_STATUS 5 and token -1.
 * Requiring sorted lists (unlike SampleRequest, which sorts them) lets the GPU plane check and
 * merge a row in one pass on the device; the clients sort what they pack.
 *
 * One step, engine side, in stream order (every value below is fixed, so a CUDA graph can hold
 * the whole sequence and replay it):
 *   1. write logits rows [0, B), params rows [0, B) (and the token_bitmask and processors rows
 *      [0, B) when the session has them); write control.batch = B;
 *   2. write control.doorbell = SAMPLERD_RING                 (cuStreamWriteValue32, default flags:
 *                                                               the write is fenced after 1.)
 *   3. wait until control.done == SAMPLERD_DONE               (cuStreamWaitValue32, EQ)
 *   4. write control.done = 0                                 (cuStreamWriteValue32)
 *   5. read token_ids, row_status (and sampled_logprobs) rows [0, B); check control.step_status.
 * Server side, per step: see doorbell == SAMPLERD_RING; write doorbell = 0; validate batch and
 * every row's parameters (a bad row gets ROW_STATUS 4 and token -1, its neighbours are
 * unaffected); sample; write the outputs and step_status; increment steps_done; write
 * done = SAMPLERD_DONE (GPU plane: all enqueued on the server's stream at the ring, so no host
 * work sits between the kernels and done).
 *
 * Faults. control.step_status says how the step ended:
 *   SAMPLERD_STEP_OK         the outputs hold rows [0, B);
 *   SAMPLERD_STEP_BAD_BATCH  B was 0 or above max_batch: nothing was sampled;
 *   SAMPLERD_STEP_ABORTED    the session ended (the server drains or closed it, or the client
 *                            library saw the server go away and released the wait itself):
 *                            no outputs; the engine must not ring again.
 * When the session ends, the server writes step_status = ABORTED and done = SAMPLERD_DONE so
 * that a pending engine wait completes. If the server dies instead, the client library (which
 * watches the gRPC stream) writes the same two words itself, within 1 s.
 */
#ifndef SAMPLERD_V1_DEVICE_SESSION_H_
#define SAMPLERD_V1_DEVICE_SESSION_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Flag values. Each flag is reset to 0 by the side that consumes it. */
#define SAMPLERD_RING 1u
#define SAMPLERD_DONE 1u

/* control.step_status values. */
#define SAMPLERD_STEP_OK 0u
#define SAMPLERD_STEP_BAD_BATCH 1u
#define SAMPLERD_STEP_ABORTED 2u

/* Row status values written to row_status (sampler.proto's RowStatus numbers). */
#define SAMPLERD_ROW_OK 1
#define SAMPLERD_ROW_INVALID_NAN 2
#define SAMPLERD_ROW_INVALID_NO_FINITE 3
#define SAMPLERD_ROW_INVALID_PARAMS 4
/* Written only by sessions opened with token_bitmask or processors (a row left with nothing
 * allowed); sessions without them never write it. */
#define SAMPLERD_ROW_INVALID_NO_ALLOWED 5

#define SAMPLERD_CONTROL_BYTES 256u
#define SAMPLERD_CONTROL_ALIGN 64u
#define SAMPLERD_PARAMS_ALIGN 8u
#define SAMPLERD_BITMASK_ALIGN 4u
#define SAMPLERD_PROCESSORS_ALIGN 4u

/* The control block: engine-written words and server-written words in separate 64-byte lines,
 * so that neither side's polling touches the other's line. */
struct samplerd_control {
  /* Line 0, written by the engine. */
  uint32_t doorbell; /* offset 0: SAMPLERD_RING when a step is ready; the server resets it */
  uint32_t batch;    /* offset 4: B of the ringing step, 1..max_batch */
  uint32_t engine_reserved[14];
  /* Line 1, written by the server (and by the client library when the server is gone). */
  uint32_t done;        /* offset 64: SAMPLERD_DONE when the step's outputs are written */
  uint32_t step_status; /* offset 68: SAMPLERD_STEP_* of the last step */
  uint32_t steps_done;  /* offset 72: steps completed by the server, mod 2^32 (diagnostics) */
  uint32_t server_reserved[13];
  /* Lines 2-3: reserved, zero. */
  uint32_t reserved[32];
};

/* Byte offsets of the control words. */
#define SAMPLERD_CONTROL_DOORBELL 0u
#define SAMPLERD_CONTROL_BATCH 4u
#define SAMPLERD_CONTROL_DONE 64u
#define SAMPLERD_CONTROL_STEP_STATUS 68u
#define SAMPLERD_CONTROL_STEPS_DONE 72u

/* Byte offsets of the params arrays for max_batch M, and the size of the whole buffer. */
static inline uint64_t samplerd_params_seed_offset(uint32_t m) { return 0ull * m; }
static inline uint64_t samplerd_params_position_offset(uint32_t m) { return 8ull * m; }
static inline uint64_t samplerd_params_temperature_offset(uint32_t m) { return 16ull * m; }
static inline uint64_t samplerd_params_top_k_offset(uint32_t m) { return 20ull * m; }
static inline uint64_t samplerd_params_top_p_offset(uint32_t m) { return 24ull * m; }
static inline uint64_t samplerd_params_min_p_offset(uint32_t m) { return 28ull * m; }
static inline uint64_t samplerd_params_top_p_mode_offset(uint32_t m) { return 32ull * m; }
static inline uint64_t samplerd_params_bytes(uint32_t m) { return 36ull * m; }

/* Words per row of the token_bitmask buffer, and its size for max_batch M and vocab V. */
static inline uint64_t samplerd_bitmask_words(uint32_t v) { return (v + 31ull) / 32ull; }
static inline uint64_t samplerd_bitmask_bytes(uint32_t m, uint32_t v) {
  return 4ull * m * samplerd_bitmask_words(v);
}

/* Byte offsets of the processors arrays for max_batch M, bias capacity NB and history capacity
 * NH, and the size of the whole buffer. */
static inline uint64_t samplerd_processors_repetition_offset(uint32_t m) { return 0ull * m; }
static inline uint64_t samplerd_processors_presence_offset(uint32_t m) { return 4ull * m; }
static inline uint64_t samplerd_processors_frequency_offset(uint32_t m) { return 8ull * m; }
static inline uint64_t samplerd_processors_bias_offsets_offset(uint32_t m) { return 12ull * m; }
static inline uint64_t samplerd_processors_bias_tokens_offset(uint32_t m) {
  return 12ull * m + 4ull * (m + 1ull);
}
static inline uint64_t samplerd_processors_biases_offset(uint32_t m, uint32_t nb) {
  return samplerd_processors_bias_tokens_offset(m) + 4ull * nb;
}
static inline uint64_t samplerd_processors_history_offsets_offset(uint32_t m, uint32_t nb) {
  return samplerd_processors_biases_offset(m, nb) + 4ull * nb;
}
static inline uint64_t samplerd_processors_history_tokens_offset(uint32_t m, uint32_t nb) {
  return samplerd_processors_history_offsets_offset(m, nb) + 4ull * (m + 1ull);
}
static inline uint64_t samplerd_processors_output_counts_offset(uint32_t m, uint32_t nb,
                                                                uint32_t nh) {
  return samplerd_processors_history_tokens_offset(m, nb) + 4ull * nh;
}
static inline uint64_t samplerd_processors_in_prompt_offset(uint32_t m, uint32_t nb, uint32_t nh) {
  return samplerd_processors_output_counts_offset(m, nb, nh) + 4ull * nh;
}
static inline uint64_t samplerd_processors_bytes(uint32_t m, uint32_t nb, uint32_t nh) {
  return samplerd_processors_in_prompt_offset(m, nb, nh) + 1ull * nh;
}

#ifdef __cplusplus
} /* extern "C" */
static_assert(sizeof(samplerd_control) == SAMPLERD_CONTROL_BYTES, "control block layout");
#endif

#endif /* SAMPLERD_V1_DEVICE_SESSION_H_ */
