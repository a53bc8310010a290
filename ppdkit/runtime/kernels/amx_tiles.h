// AMX tiles, shared by the bfloat16 (skinny_linear.cpp) and int8 (quantized_linear.cpp) kernels: Linux's
// permission, the 64-byte tile configuration, and a scope that leaves a thread's tiles as it found them.
#pragma once
#if defined(__AMX_TILE__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace amx {

// Linux enables the tile registers per process on request (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
inline bool permitted() {
  static const bool granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// ldtilecfg/sttilecfg as asm whose memory operand is all 64 bytes: GCC 12's _tile_loadconfig declares an 8-byte
// read, so the stores that fill the rest may be dropped (AMX then faults).
inline void load(const TileConfig& config) { asm volatile("ldtilecfg %0" ::"m"(config)); }
inline void store(TileConfig& config) { asm volatile("sttilecfg %0" : "=m"(config)); }

// Our configuration for a kernel's work on this thread, then the thread's own back: another library in the
// process (llama.cpp's AMX kernels, in the bench) configures a thread's tiles once and keeps using them, so
// releasing them, or leaving ours, would make its next tile load fault.
class Scope {
 public:
  explicit Scope(const TileConfig& mine) {
    store(saved_);
    load(mine);
  }
  ~Scope() {
    if (saved_.palette) {
      load(saved_);
    } else {
      _tile_release();  // none before: leave none (the tile state is large for the next context switch)
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  TileConfig saved_;
};

}  // namespace amx
#endif
