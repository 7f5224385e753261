// Helpers shared by the sgrpo AscendC kernels (device side). Compiles with the CANN kernel_operator.h (bisheng) or with
// the CPU test double csrc/emu/kernel_operator.h (g++ -DSGRPO_EMU).
#ifndef SGRPO_ASCEND_KERNEL_COMMON_H
#define SGRPO_ASCEND_KERNEL_COMMON_H

#include "kernel_operator.h"
#include "sgrpo_tiling.h"

namespace sgrpo {

// Pipe-to-pipe ordering for buffers that do not go through a TQue (TBuf scratch read by the scalar unit, written by
// MTE2, read by MTE3, ...): set and immediately wait on one event.
template <AscendC::HardEvent E>
__aicore__ inline void PipeSync() {
  const int32_t id = static_cast<int32_t>(AscendC::GetTPipePtr()->FetchEventID(E));
  AscendC::SetFlag<E>(id);
  AscendC::WaitFlag<E>(id);
}

// Row-group driver shared by the kernels. A kernel class derives from RowGroupKernel<itself> (CRTP: static dispatch,
// no virtual call, function pointer or lambda in device code), calls SplitRows(n_rows) in its Init() and defines
//   __aicore__ inline void ProcessGroup(uint64_t row0, uint32_t count);   // (private: befriend RowGroupKernel)
// Process() then hands ProcessGroup this core's rows (CoreRows) in groups of kRowGroup rows, the last one shorter.
template <class Kernel>
class RowGroupKernel {
 public:
  __aicore__ inline RowGroupKernel() {}

  __aicore__ inline void Process() {
    for (uint64_t g = 0; g < rows_.count; g += kRowGroup) {
      const uint64_t left = rows_.count - g;
      const uint32_t gn = static_cast<uint32_t>(left < kRowGroup ? left : kRowGroup);
      static_cast<Kernel*>(this)->ProcessGroup(rows_.start + g, gn);
    }
  }

 protected:
  // This core's share of the launch's n_rows rows.
  __aicore__ inline void SplitRows(int64_t n_rows) {
    rows_ = CoreRows(static_cast<uint64_t>(n_rows), static_cast<uint32_t>(AscendC::GetBlockNum()),
                     static_cast<uint32_t>(AscendC::GetBlockIdx()));
  }

 private:
  RowRange rows_{0, 0};
};

// A row group of int64 targets is copied as 2 * n int32 words (DataCopyPad of b32 is supported everywhere) and
// reassembled by the scalar unit (little endian).
__aicore__ inline int64_t TargetAt(const AscendC::LocalTensor<int32_t>& words, uint32_t i) {
  const uint32_t lo = static_cast<uint32_t>(words.GetValue(2 * i));
  const int64_t hi = static_cast<int64_t>(words.GetValue(2 * i + 1));
  return static_cast<int64_t>((static_cast<uint64_t>(hi) << 32) | lo);
}

// GM -> UB copy of `count` elements starting anywhere in GM (tails and unaligned row starts): one DataCopyPad block.
template <typename T>
__aicore__ inline void CopyInPad(const AscendC::LocalTensor<T>& dst, const AscendC::GlobalTensor<T>& src,
                                 uint32_t count) {
  AscendC::DataCopyExtParams p{1, static_cast<uint32_t>(count * sizeof(T)), 0, 0, 0};
  AscendC::DataCopyPadExtParams<T> pad{false, 0, 0, T{}};
  AscendC::DataCopyPad(dst, src, p, pad);
}

template <typename T>
__aicore__ inline void CopyOutPad(const AscendC::GlobalTensor<T>& dst, const AscendC::LocalTensor<T>& src,
                                  uint32_t count) {
  AscendC::DataCopyExtParams p{1, static_cast<uint32_t>(count * sizeof(T)), 0, 0, 0};
  AscendC::DataCopyPad(dst, src, p);
}

// Load `count` input elements (T) of a tile as fp32 in `z`, scaled by 1/tau: bf16/fp16 are cast in UB (Exp/Ln/Reduce*
// are half/float only on 910B, and accumulation is fp32 always).
template <typename T>
__aicore__ inline void ToScaledFloat(const AscendC::LocalTensor<float>& z, const AscendC::LocalTensor<T>& x,
                                     float inv_tau, uint32_t count) {
  if constexpr (sizeof(T) == 4) {
    AscendC::Muls(z, x, inv_tau, static_cast<int32_t>(count));
  } else {
    AscendC::Cast(z, x, AscendC::RoundMode::CAST_NONE, count);
    AscendC::Muls(z, z, inv_tau, static_cast<int32_t>(count));
  }
}

template <typename T>
__aicore__ inline void FromFloat(const AscendC::LocalTensor<T>& y, const AscendC::LocalTensor<float>& z, float scale,
                                 uint32_t count) {
  if constexpr (sizeof(T) == 4) {
    AscendC::Muls(y, z, scale, static_cast<int32_t>(count));
  } else {
    AscendC::Muls(z, z, scale, static_cast<int32_t>(count));
    AscendC::Cast(y, z, AscendC::RoundMode::CAST_RINT, count);
  }
}

}  // namespace sgrpo

// Kernel launch: `<<<blockDim, l2ctrl, stream>>>` under the CANN toolchain; under the CPU test double, every core of the
// launch runs in turn (sgrpo_emu::launch, which also checks queue state and cross-core GM writes).
#ifdef SGRPO_EMU
#define SGRPO_LAUNCH(kernel, block_dim, stream, ...) ::sgrpo_emu::launch((block_dim), [&]() { kernel(__VA_ARGS__); })
#else
#define SGRPO_LAUNCH(kernel, block_dim, stream, ...) kernel<<<(block_dim), nullptr, (stream)>>>(__VA_ARGS__)
#endif

#endif  // SGRPO_ASCEND_KERNEL_COMMON_H
