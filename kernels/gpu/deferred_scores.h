// The exact scores of a Gumbel-max draw over one staged chunk, deferred and scored a wave at a
// time (v29).
//
// MayBeat (device_common.h) lets few of a dense chunk's tokens through to the exact score z + G
// (two logf): ~7% of an engine-like row's kept tokens, fewer on flat rows. But a wave runs a
// rare path whenever any one of its lanes needs it, and with 32 lanes that is nearly every time:
// in v28 the exact score ran in 69% of a wave's token slots on engine-like rows (ncu SASS
// counts), ~160 instructions a kept token in MassDrawKernel. So a lane only offers the tokens
// that pass a one-comparison test on their Philox word (BitsFloor: MayBeat at the largest z of
// the chunk, against the wave's best score so far, as a floor on the bits, UniformBitsFloor:
// no uniform is made for a token that fails it, v37); the offers wait per wave in shared memory
// and are scored kWaveSize at a time, one a lane: MayBeat, then the exact score. The floor is the
// wave's best score so far (a drawn token's score, so a valid floor, and higher than a lane's own
// best). The token is the same as scoring in place: every token that could win is scored exactly,
// and the argmax (lowest index on ties) does not depend on the order of scoring.
//
// The waves of a block share their floors (v46): each wave publishes its best score after it
// scores, and reads the block's best at every Collect. A wave's own floor covers its 128 tokens a
// group; the block's covers 1,024, so after the first group far fewer tokens pass BitsFloor, and
// a Collect in which no lane offers anything costs one vote.
#ifndef SAMPLERD_KERNELS_GPU_DEFERRED_SCORES_H_
#define SAMPLERD_KERNELS_GPU_DEFERRED_SCORES_H_

#include <cstdint>

#include "kernels/common/philox.h"
#include "kernels/gpu/device_common.h"
#include "kernels/gpu/platform.h"

namespace samplerd::kernels::gpu {

template <int kThreads>
class DeferredScores {
 public:
  static constexpr int kOffersPerLane = 4;  // at most, in one Collect
  // Fewer than kWaveSize offers wait between calls, so this many slots always suffice.
  static constexpr int kPerWave = (kOffersPerLane + 1) * kWaveSize;
  static constexpr int kSlots = (kOffersPerLane + 1) * kThreads;  // every wave's

  struct Storage {
    uint32_t bits[kSlots];  // the offer's Philox word (UniformFromBits makes its u)
    uint16_t at[kSlots];
  };

  // `chunk`: the staged chunk's x (after the row's processors), token `begin` at offset 0.
  // `top_z`: the largest z of the tokens that will be offered. `floor`: a score some token of
  // the row reaches (or -inf). Both the same in every lane of the wave. `block_floor`: shared by
  // the block's waves, OrderedKey of a score some token of the row reaches (kNegInfKey at first),
  // written before any wave constructs its DeferredScores.
  __device__ DeferredScores(Storage& storage, const float* chunk, int64_t begin, float temperature,
                            float top_z, float floor, uint32_t* block_floor)
      : bits_(storage.bits + Wave() * kPerWave),
        at_(storage.at + Wave() * kPerWave),
        block_floor_(block_floor),
        chunk_(chunk),
        begin_(begin),
        temperature_(temperature),
        top_z_(top_z),
        floor_(floor),
        bits_floor_(UniformBitsFloor(MayBeatThreshold(top_z, floor))) {}

  // The floor MayBeat should test against now (the same in every lane of the wave).
  __device__ float Floor() const { return floor_; }
  // A token whose Philox word is below this cannot win, whatever its z (its u is below
  // MayBeatThreshold at top_z): one integer comparison instead of MayBeat's two exps for most
  // tokens once the floor has risen, and no uniform made for them.
  __device__ uint32_t BitsFloor() const { return bits_floor_; }

  // Offers this lane's tokens: for each bit e of `mask` (e < kOffersPerLane), the token at chunk
  // offset at[e] with its Philox word bits[e]. Every lane of the wave calls, together.
  __device__ __forceinline__ void Collect(uint32_t mask, const int* at, const uint32_t* bits) {
    if (WaveAny(mask != 0u)) {  // once the floor has risen, most waves offer nothing
      int total;
      int slot = waiting_ + WaveExclusiveSum(__popc(mask), &total);
#pragma unroll
      for (int e = 0; e < kOffersPerLane; ++e) {
        if (!AnyBitSet(mask, 1u << e)) continue;
        bits_[slot] = bits[e];
        at_[slot] = static_cast<uint16_t>(at[e]);
        ++slot;
      }
      waiting_ += total;
      WaveSync();
      while (waiting_ >= kWaveSize) Score(kWaveSize);
    }
    RaiseFloor(KeyToFloat(__shfl(*static_cast<volatile uint32_t*>(block_floor_), 0, kWaveSize)));
  }

  // Scores what waits now, however few (to raise the floor early). Every lane of the wave calls,
  // together.
  __device__ __forceinline__ void Flush() {
    if (waiting_ > 0) Score(waiting_);
  }

  // Scores what still waits; returns this lane's best (the caller reduces over the block).
  // Every lane of the wave calls, together.
  __device__ __forceinline__ ArgMaxPair Finish() {
    Flush();
    return best_;
  }

 private:
  __device__ static int Wave() { return static_cast<int>(threadIdx.x) / kWaveSize; }

  // Scores the last n (<= kWaveSize) offers, one a lane.
  __device__ __forceinline__ void Score(int n) {
    waiting_ -= n;
    const int lane = static_cast<int>(threadIdx.x) % kWaveSize;
    if (lane < n) {
      const int at = at_[waiting_ + lane];
      const float u = UniformFromBits(bits_[waiting_ + lane]);
      const float z = chunk_[at] / temperature_;  // x / 1 is x: the same bits as z_of
      if (MayBeat(z, u, floor_)) {
        const ArgMaxPair scored{z + GumbelFromUniform(u), begin_ + at};
        if (Better(scored, best_)) best_ = scored;
      }
    }
    const float wave_best = WaveMax(best_.value);
    if (lane == 0 && wave_best > -kInfF) atomicMax(block_floor_, OrderedKey(wave_best));
    RaiseFloor(wave_best);
    WaveSync();  // the slots are read before the next Collect writes them
  }

  // `floor`: a score some token of the row reaches, the same in every lane of the wave.
  __device__ __forceinline__ void RaiseFloor(float floor) {
    if (!(floor > floor_)) return;
    floor_ = floor;
    bits_floor_ = UniformBitsFloor(MayBeatThreshold(top_z_, floor_));
  }

  uint32_t* bits_;
  uint16_t* at_;
  uint32_t* block_floor_;
  const float* chunk_;
  int64_t begin_;
  float temperature_;
  float top_z_;
  float floor_;
  uint32_t bits_floor_;
  int waiting_ = 0;  // the same in every lane of the wave
  ArgMaxPair best_{-kInfF, INT64_MAX};
};

}  // namespace samplerd::kernels::gpu

#endif  // SAMPLERD_KERNELS_GPU_DEFERRED_SCORES_H_
