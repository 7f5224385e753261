// CPU emulation of the small AscendC API subset used by csrc/ascend/*.cpp -- a TEST DOUBLE, not CANN.
//
// Put csrc/emu first on the include path (g++ -DSGRPO_EMU -I csrc/emu -I csrc/ascend) and the unchanged kernel sources
// compile with g++ and run on the CPU: each AIV core of a launch runs sequentially with its own 192 KiB "UB".
//
// What it checks (throws sgrpo_emu::EmuError, reported by the launch wrapper):
//   * UB capacity: TPipe::InitBuffer totals per core <= 192 KiB; every buffer 32 B aligned and 32 B rounded;
//   * alignment: every LocalTensor operand of a vector op / DataCopy starts on a 32 B boundary of UB; DataCopy lengths are
//     whole 32 B blocks (tails must use DataCopyPad); ReduceMax/ReduceSum tmp buffers are large enough;
//   * bounds: vector op counts and GetValue/SetValue indices within the tensor; GM accesses within SetGlobalBuffer sizes;
//   * queue discipline: AllocTensor with no free buffer (a hang on hardware), EnQue/DeQue/FreeTensor out of order,
//     buffers still held when the core finishes, WaitFlag without SetFlag;
//   * cores: GM byte ranges written by two different cores of one launch must not overlap (no cross-core races);
//   * data types: Exp/Ln/Reduce* only on float/half (as on 910B), Cast round modes (narrowing needs CAST_RINT).
// Padding bytes that DataCopyPad leaves undefined are filled with 0xFF (NaN for floats), so reading them shows up.
//
// What it does NOT model: pipeline timing and the need for SetFlag/WaitFlag between MTE/V/S pipes (everything runs in
// program order here, so a missing sync passes), bank conflicts, true cross-core concurrency, hardware Exp/Ln accuracy
// (std::exp/std::log in fp32 here), the repeat/mask encodings of the level-0 APIs, bisheng language restrictions.
// Passing under this emulator is evidence about indexing, tails, alignment and numerics -- not about performance or
// synchronisation on a real NPU.
#ifndef SGRPO_EMU_KERNEL_OPERATOR_H
#define SGRPO_EMU_KERNEL_OPERATOR_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*

namespace sgrpo_emu {

struct EmuError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define EMU_CHECK(cond, msg)                                                                  \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::ostringstream _os;                                                                 \
      _os << "AscendC emulator: " << msg << " [" << #cond << " at " << __FILE__ << ":" << __LINE__ << "]"; \
      throw ::sgrpo_emu::EmuError(_os.str());                                                 \
    }                                                                                         \
  } while (0)

constexpr uint32_t kUbBytes = 192u * 1024u;

struct GmWrite {
  uintptr_t begin, end;
  uint32_t core;
};

// Per-launch / per-core state (single-threaded emulation).
struct CoreState {
  alignas(64) uint8_t ub[kUbBytes];
  uint32_t ub_used = 0;
  uint32_t block_idx = 0;
  uint32_t block_num = 1;
  int open_flags[64] = {};
  uint64_t stats_vector_ops = 0;
};

inline CoreState& core() {
  static CoreState* c = new CoreState();
  return *c;
}
inline std::vector<GmWrite>& gm_writes() {
  static std::vector<GmWrite> w;
  return w;
}
inline void record_gm_write(const void* p, uint64_t bytes) {
  if (bytes == 0) return;
  const uintptr_t b = reinterpret_cast<uintptr_t>(p);
  gm_writes().push_back({b, b + bytes, core().block_idx});
}

// Runs `body` once per core (block_idx 0..block_dim-1) with a fresh UB, then checks queue state and cross-core writes.
template <class F>
void launch(uint32_t block_dim, F&& body) {
  EMU_CHECK(block_dim >= 1 && block_dim <= 65535, "blockDim " << block_dim << " out of range");
  gm_writes().clear();
  for (uint32_t b = 0; b < block_dim; ++b) {
    CoreState& c = core();
    c.ub_used = 0;
    c.block_idx = b;
    c.block_num = block_dim;
    std::fill(std::begin(c.open_flags), std::end(c.open_flags), 0);
    std::memset(c.ub, 0xFF, sizeof(c.ub));  // uninitialised UB reads as NaN
    body();  // the kernel object dies here: TQue destructors check that every buffer was freed
  }
  auto& w = gm_writes();
  std::sort(w.begin(), w.end(), [](const GmWrite& a, const GmWrite& b) { return a.begin < b.begin; });
  uintptr_t max_end = 0;
  uint32_t max_core = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (i > 0 && w[i].begin < max_end) {
      EMU_CHECK(w[i].core == max_core, "GM bytes written by core " << max_core << " and core " << w[i].core);
    }
    if (w[i].end > max_end) {
      max_end = w[i].end;
      max_core = w[i].core;
    }
  }
  w.clear();
}

}  // namespace sgrpo_emu

// ------------------------------------------------------------------------------------------------ scalar types
using half = _Float16;

struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  static bfloat16_t from_float_rne(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bfloat16_t r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      r.bits = static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      r.bits = static_cast<uint16_t>(u >> 16);
    }
    return r;
  }
  float to_float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
static_assert(sizeof(bfloat16_t) == 2, "bf16 size");

namespace AscendC {

enum class TPosition { GM, VECIN, VECOUT, VECCALC, A1, A2, B1, B2, CO1, CO2 };
using QuePosition = TPosition;
enum class RoundMode { CAST_NONE, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum class HardEvent { MTE2_V, V_MTE2, MTE3_V, V_MTE3, MTE2_S, S_MTE2, MTE3_S, S_MTE3, V_S, S_V, MTE2_MTE3, MTE3_MTE2 };
enum pipe_t { PIPE_S, PIPE_V, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };
using event_t = int32_t;

inline int64_t GetBlockIdx() { return sgrpo_emu::core().block_idx; }
inline int64_t GetBlockNum() { return sgrpo_emu::core().block_num; }

template <typename T>
class GlobalTensor {
 public:
  void SetGlobalBuffer(__gm__ T* buffer, uint64_t size) {
    base_ = buffer;
    size_ = size;
  }
  GlobalTensor operator[](uint64_t offset) const {
    EMU_CHECK(offset <= size_, "GlobalTensor offset " << offset << " beyond size " << size_);
    GlobalTensor g;
    g.base_ = base_ + offset;
    g.size_ = size_ - offset;
    return g;
  }
  T GetValue(uint64_t i) const {
    EMU_CHECK(i < size_, "GM GetValue index " << i << " >= " << size_);
    return base_[i];
  }
  void SetValue(uint64_t i, T v) {
    EMU_CHECK(i < size_, "GM SetValue index " << i << " >= " << size_);
    sgrpo_emu::record_gm_write(base_ + i, sizeof(T));
    base_[i] = v;
  }
  T* GetPhyAddr() const { return base_; }
  uint64_t GetSize() const { return size_; }

 private:
  T* base_ = nullptr;
  uint64_t size_ = 0;
};

template <typename T>
class LocalTensor {
 public:
  LocalTensor() = default;
  LocalTensor(T* p, uint32_t n, TPosition pos, int32_t id = -1) : ptr_(p), size_(n), pos_(pos), buf_id_(id) {}
  LocalTensor operator[](uint32_t offset) const {
    EMU_CHECK(offset <= size_, "LocalTensor offset " << offset << " beyond size " << size_);
    return LocalTensor(ptr_ + offset, size_ - offset, pos_, buf_id_);
  }
  T GetValue(uint32_t i) const {
    EMU_CHECK(ptr_ != nullptr, "GetValue on an unallocated LocalTensor");
    EMU_CHECK(i < size_, "UB GetValue index " << i << " >= " << size_);
    return ptr_[i];
  }
  void SetValue(uint32_t i, T v) const {
    EMU_CHECK(ptr_ != nullptr, "SetValue on an unallocated LocalTensor");
    EMU_CHECK(i < size_, "UB SetValue index " << i << " >= " << size_);
    ptr_[i] = v;
  }
  uint32_t GetSize() const { return size_; }
  template <typename U>
  LocalTensor<U> ReinterpretCast() const {
    return LocalTensor<U>(reinterpret_cast<U*>(ptr_), static_cast<uint32_t>(size_ * sizeof(T) / sizeof(U)), pos_,
                          buf_id_);
  }
  // emulator internals
  T* ptr() const { return ptr_; }
  int32_t buf_id() const { return buf_id_; }
  uint32_t ub_offset() const {
    return static_cast<uint32_t>(reinterpret_cast<const uint8_t*>(ptr_) - sgrpo_emu::core().ub);
  }

 private:
  T* ptr_ = nullptr;
  uint32_t size_ = 0;
  TPosition pos_ = TPosition::VECCALC;
  int32_t buf_id_ = -1;
};

class TPipe;

namespace detail {
inline uint32_t ub_alloc(uint32_t bytes) {
  auto& c = sgrpo_emu::core();
  EMU_CHECK(bytes > 0, "InitBuffer of 0 bytes");
  EMU_CHECK(bytes % 32 == 0, "InitBuffer length " << bytes << " is not a multiple of 32 B");
  const uint32_t off = c.ub_used;
  EMU_CHECK(static_cast<uint64_t>(off) + bytes <= sgrpo_emu::kUbBytes,
            "UB overflow: " << off << " + " << bytes << " > " << sgrpo_emu::kUbBytes << " bytes (error 507015 on 910B)");
  c.ub_used = off + bytes;
  return off;
}
template <typename T>
void check_operand(const LocalTensor<T>& t, uint32_t count, const char* what) {
  EMU_CHECK(t.ptr() != nullptr, what << ": operand not allocated");
  EMU_CHECK(t.ub_offset() % 32 == 0, what << ": UB operand at offset " << t.ub_offset() << " is not 32 B aligned");
  EMU_CHECK(count <= t.GetSize(), what << ": count " << count << " exceeds tensor size " << t.GetSize());
  EMU_CHECK(count > 0, what << ": count 0");
}
inline void count_op() { ++sgrpo_emu::core().stats_vector_ops; }
}  // namespace detail

template <TPosition POS>
class TBuf {
 public:
  template <typename T>
  LocalTensor<T> Get() const {
    EMU_CHECK(bytes_ > 0, "TBuf::Get before InitBuffer");
    return LocalTensor<T>(reinterpret_cast<T*>(sgrpo_emu::core().ub + off_), bytes_ / sizeof(T), POS);
  }
  template <typename T>
  LocalTensor<T> Get(uint32_t len) const {
    EMU_CHECK(len * sizeof(T) <= bytes_, "TBuf::Get(" << len << ") beyond " << bytes_ << " bytes");
    return LocalTensor<T>(reinterpret_cast<T*>(sgrpo_emu::core().ub + off_), len, POS);
  }
  void init(uint32_t off, uint32_t bytes) {
    off_ = off;
    bytes_ = bytes;
  }

 private:
  uint32_t off_ = 0, bytes_ = 0;
};

template <TPosition POS, int32_t DEPTH>
class TQue {
 public:
  enum class St { Free, Allocated, Queued, Dequeued };
  void init(uint32_t num, uint32_t off, uint32_t bytes) {
    EMU_CHECK(num >= 1 && num <= 8, "TQue buffer count " << num);
    num_ = num;
    off_ = off;
    bytes_ = bytes;
    state_.assign(num, St::Free);
    fifo_.clear();
  }
  TQue() = default;
  TQue(const TQue&) = delete;
  TQue& operator=(const TQue&) = delete;
  // The kernel object (and its queues) dies at the end of the core's run: every buffer must be free by then.
  ~TQue() noexcept(false) {
    if (std::uncaught_exceptions() > 0) return;
    for (uint32_t i = 0; i < num_; ++i)
      EMU_CHECK(state_[i] == St::Free, "kernel finished with queue buffer " << i << " still held");
  }
  template <typename T>
  LocalTensor<T> AllocTensor() {
    EMU_CHECK(num_ > 0, "AllocTensor before InitBuffer");
    for (uint32_t i = 0; i < num_; ++i) {
      if (state_[i] == St::Free) {
        state_[i] = St::Allocated;
        return LocalTensor<T>(reinterpret_cast<T*>(sgrpo_emu::core().ub + off_ + i * bytes_), bytes_ / sizeof(T), POS,
                              static_cast<int32_t>(i));
      }
    }
    EMU_CHECK(false, "AllocTensor with all " << num_ << " buffers in use (deadlock on hardware)");
    return {};
  }
  template <typename T>
  bool EnQue(const LocalTensor<T>& t) {
    const int32_t id = own(t);
    EMU_CHECK(state_[id] == St::Allocated, "EnQue of a buffer that is not freshly allocated");
    EMU_CHECK(fifo_.size() < static_cast<size_t>(DEPTH), "EnQue beyond queue depth " << DEPTH);
    state_[id] = St::Queued;
    fifo_.push_back(id);
    return true;
  }
  template <typename T>
  LocalTensor<T> DeQue() {
    EMU_CHECK(!fifo_.empty(), "DeQue from an empty queue (deadlock on hardware)");
    const int32_t id = fifo_.front();
    fifo_.erase(fifo_.begin());
    state_[id] = St::Dequeued;
    return LocalTensor<T>(reinterpret_cast<T*>(sgrpo_emu::core().ub + off_ + id * bytes_), bytes_ / sizeof(T), POS, id);
  }
  template <typename T>
  void FreeTensor(const LocalTensor<T>& t) {
    const int32_t id = own(t);
    EMU_CHECK(state_[id] == St::Dequeued || state_[id] == St::Allocated,
              "FreeTensor of a buffer that is free or still queued");
    state_[id] = St::Free;
  }

 private:
  template <typename T>
  int32_t own(const LocalTensor<T>& t) const {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.ptr());
    const uint8_t* base = sgrpo_emu::core().ub + off_;
    EMU_CHECK(p >= base && p < base + num_ * bytes_, "tensor does not belong to this queue");
    EMU_CHECK((p - base) % bytes_ == 0, "tensor is a sub-view, not the allocated buffer");
    return static_cast<int32_t>((p - base) / bytes_);
  }
  uint32_t num_ = 0, off_ = 0, bytes_ = 0;
  std::vector<St> state_;
  std::vector<int32_t> fifo_;
};

class TPipe {
 public:
  TPipe() { instance() = this; }
  ~TPipe() {
    if (instance() == this) instance() = nullptr;
  }
  template <class Q>
  void InitBuffer(Q& que, uint32_t num, uint32_t len) {
    const uint32_t off = detail::ub_alloc(num * len);
    que.init(num, off, len);
  }
  template <TPosition POS>
  void InitBuffer(TBuf<POS>& buf, uint32_t len) {
    buf.init(detail::ub_alloc(len), len);
  }
  template <HardEvent E>
  event_t FetchEventID() {
    return static_cast<event_t>(E);
  }
  event_t FetchEventID(HardEvent e) { return static_cast<event_t>(e); }
  static TPipe*& instance() {
    static TPipe* p = nullptr;
    return p;
  }
};
inline TPipe* GetTPipePtr() {
  EMU_CHECK(TPipe::instance() != nullptr, "GetTPipePtr without a live TPipe");
  return TPipe::instance();
}

template <HardEvent E>
void SetFlag(event_t id) {
  sgrpo_emu::core().open_flags[(static_cast<int>(E) * 4 + id) & 63]++;
}
template <HardEvent E>
void WaitFlag(event_t id) {
  int& n = sgrpo_emu::core().open_flags[(static_cast<int>(E) * 4 + id) & 63];
  EMU_CHECK(n > 0, "WaitFlag without a matching SetFlag");
  --n;
}
template <pipe_t P>
void PipeBarrier() {}

// ------------------------------------------------------------------------------------------------ data movement
struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;   // bytes per block
  uint32_t srcStride = 0;  // GM->UB: bytes between GM blocks; UB->GM: 32 B blocks between UB blocks
  uint32_t dstStride = 0;  // GM->UB: 32 B blocks between UB blocks; UB->GM: bytes between GM blocks
  uint32_t rsv = 0;
  DataCopyExtParams() = default;
  DataCopyExtParams(uint16_t count, uint32_t len, uint32_t src, uint32_t dst, uint32_t r)
      : blockCount(count), blockLen(len), srcStride(src), dstStride(dst), rsv(r) {}
};
template <typename T>
struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;
  T paddingValue{};
  DataCopyPadExtParams() = default;
  DataCopyPadExtParams(bool pad, uint8_t l, uint8_t r, T v) : isPad(pad), leftPadding(l), rightPadding(r), paddingValue(v) {}
};

template <typename T>
void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count) {
  detail::check_operand(dst, count, "DataCopy GM->UB");
  EMU_CHECK((count * sizeof(T)) % 32 == 0, "DataCopy GM->UB of " << count * sizeof(T) << " B: not whole 32 B blocks, use DataCopyPad");
  EMU_CHECK(count <= src.GetSize(), "DataCopy GM->UB reads past the GM buffer");
  std::memcpy(dst.ptr(), src.GetPhyAddr(), count * sizeof(T));
}
template <typename T>
void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count) {
  detail::check_operand(src, count, "DataCopy UB->GM");
  EMU_CHECK((count * sizeof(T)) % 32 == 0, "DataCopy UB->GM of " << count * sizeof(T) << " B: not whole 32 B blocks, use DataCopyPad");
  EMU_CHECK(count <= dst.GetSize(), "DataCopy UB->GM writes past the GM buffer");
  sgrpo_emu::record_gm_write(dst.GetPhyAddr(), count * sizeof(T));
  std::memcpy(dst.GetPhyAddr(), src.ptr(), count * sizeof(T));
}
template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                 const DataCopyPadExtParams<T>& pad) {
  EMU_CHECK(p.blockLen > 0 && p.blockLen % sizeof(T) == 0, "DataCopyPad blockLen " << p.blockLen);
  const uint32_t block_ub = static_cast<uint32_t>((p.blockLen + 31) / 32 * 32);
  const uint64_t ub_bytes = static_cast<uint64_t>(p.blockCount) * block_ub + (p.blockCount - 1ull) * p.dstStride * 32ull;
  detail::check_operand(dst, static_cast<uint32_t>(ub_bytes / sizeof(T)), "DataCopyPad GM->UB");
  const uint8_t* g = reinterpret_cast<const uint8_t*>(src.GetPhyAddr());
  const uint64_t gm_bytes = static_cast<uint64_t>(p.blockCount) * p.blockLen + (p.blockCount - 1ull) * p.srcStride;
  EMU_CHECK(gm_bytes <= src.GetSize() * sizeof(T), "DataCopyPad GM->UB reads past the GM buffer");
  uint8_t* u = reinterpret_cast<uint8_t*>(dst.ptr());
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    std::memcpy(u, g, p.blockLen);
    T* tail = reinterpret_cast<T*>(u + p.blockLen);
    const uint32_t n_tail = (block_ub - p.blockLen) / sizeof(T);
    for (uint32_t i = 0; i < n_tail; ++i) {
      if (pad.isPad) tail[i] = pad.paddingValue;
      else std::memset(tail + i, 0xFF, sizeof(T));
    }
    u += block_ub + p.dstStride * 32u;
    g += p.blockLen + p.srcStride;
  }
}
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p) {
  EMU_CHECK(p.blockLen > 0 && p.blockLen % sizeof(T) == 0, "DataCopyPad blockLen " << p.blockLen);
  const uint32_t block_ub = static_cast<uint32_t>((p.blockLen + 31) / 32 * 32);
  const uint64_t ub_bytes = static_cast<uint64_t>(p.blockCount) * block_ub + (p.blockCount - 1ull) * p.srcStride * 32ull;
  detail::check_operand(src, static_cast<uint32_t>((ub_bytes - (block_ub - p.blockLen)) / sizeof(T)), "DataCopyPad UB->GM");
  const uint64_t gm_bytes = static_cast<uint64_t>(p.blockCount) * p.blockLen + (p.blockCount - 1ull) * p.dstStride;
  EMU_CHECK(gm_bytes <= dst.GetSize() * sizeof(T), "DataCopyPad UB->GM writes past the GM buffer");
  uint8_t* g = reinterpret_cast<uint8_t*>(dst.GetPhyAddr());
  const uint8_t* u = reinterpret_cast<const uint8_t*>(src.ptr());
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    sgrpo_emu::record_gm_write(g, p.blockLen);
    std::memcpy(g, u, p.blockLen);
    u += block_ub + p.srcStride * 32u;
    g += p.blockLen + p.dstStride;
  }
}

// ------------------------------------------------------------------------------------------------ vector compute
namespace detail {
template <typename T>
constexpr bool is_vec_float() {
  return std::is_same<T, float>::value || std::is_same<T, half>::value;
}
template <typename T>
float to_f(T v) {
  if constexpr (std::is_same<T, bfloat16_t>::value) return v.to_float();
  else return static_cast<float>(v);
}
}  // namespace detail

template <typename T>
void Duplicate(const LocalTensor<T>& dst, const T& v, int32_t count) {
  detail::check_operand(dst, count, "Duplicate");
  detail::count_op();
  for (int32_t i = 0; i < count; ++i) dst.ptr()[i] = v;
}

#define SGRPO_EMU_UNARY(NAME, EXPR, MATH)                                                \
  template <typename T>                                                                  \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, int32_t count) {       \
    static_assert(detail::is_vec_float<T>() || !MATH, #NAME " supports half/float only"); \
    detail::check_operand(dst, count, #NAME);                                            \
    detail::check_operand(src, count, #NAME);                                            \
    detail::count_op();                                                                  \
    for (int32_t i = 0; i < count; ++i) {                                                \
      const T x = src.ptr()[i];                                                          \
      dst.ptr()[i] = static_cast<T>(EXPR);                                               \
    }                                                                                    \
  }
SGRPO_EMU_UNARY(Exp, std::exp(static_cast<float>(x)), true)
SGRPO_EMU_UNARY(Ln, std::log(static_cast<float>(x)), true)
SGRPO_EMU_UNARY(Abs, std::fabs(static_cast<float>(x)), true)
#undef SGRPO_EMU_UNARY

#define SGRPO_EMU_BINARY(NAME, OP)                                                                          \
  template <typename T>                                                                                     \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count) {   \
    static_assert(detail::is_vec_float<T>(), #NAME " supports half/float only here");                       \
    detail::check_operand(dst, count, #NAME);                                                               \
    detail::check_operand(a, count, #NAME);                                                                 \
    detail::check_operand(b, count, #NAME);                                                                 \
    detail::count_op();                                                                                     \
    for (int32_t i = 0; i < count; ++i) dst.ptr()[i] = static_cast<T>(a.ptr()[i] OP b.ptr()[i]);           \
  }
SGRPO_EMU_BINARY(Add, +)
SGRPO_EMU_BINARY(Sub, -)
SGRPO_EMU_BINARY(Mul, *)
SGRPO_EMU_BINARY(Div, /)
#undef SGRPO_EMU_BINARY

template <typename T>
void Max(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t count) {
  detail::check_operand(dst, count, "Max");
  detail::check_operand(a, count, "Max");
  detail::check_operand(b, count, "Max");
  detail::count_op();
  for (int32_t i = 0; i < count; ++i) dst.ptr()[i] = a.ptr()[i] > b.ptr()[i] ? a.ptr()[i] : b.ptr()[i];
}

#define SGRPO_EMU_SCALAR(NAME, OP)                                                                 \
  template <typename T>                                                                            \
  void NAME(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& s, int32_t count) {     \
    static_assert(detail::is_vec_float<T>(), #NAME " supports half/float only here");              \
    detail::check_operand(dst, count, #NAME);                                                      \
    detail::check_operand(src, count, #NAME);                                                      \
    detail::count_op();                                                                            \
    for (int32_t i = 0; i < count; ++i) dst.ptr()[i] = src.ptr()[i] OP s;                         \
  }
SGRPO_EMU_SCALAR(Muls, *)
SGRPO_EMU_SCALAR(Adds, +)
#undef SGRPO_EMU_SCALAR

template <typename D, typename S>
void Cast(const LocalTensor<D>& dst, const LocalTensor<S>& src, RoundMode mode, uint32_t count) {
  detail::check_operand(dst, count, "Cast");
  detail::check_operand(src, count, "Cast");
  detail::count_op();
  constexpr bool widen = std::is_same<D, float>::value && !std::is_same<S, float>::value;
  constexpr bool narrow = !std::is_same<D, float>::value && std::is_same<S, float>::value;
  static_assert(widen || narrow, "emulated Cast covers float <-> half/bfloat16_t only");
  if constexpr (widen) {
    EMU_CHECK(mode == RoundMode::CAST_NONE, "widening Cast expects CAST_NONE");
    for (uint32_t i = 0; i < count; ++i) dst.ptr()[i] = detail::to_f(src.ptr()[i]);
  } else {
    EMU_CHECK(mode == RoundMode::CAST_RINT, "narrowing Cast: this kernel set uses CAST_RINT (round to nearest even)");
    for (uint32_t i = 0; i < count; ++i) {
      if constexpr (std::is_same<D, bfloat16_t>::value) dst.ptr()[i] = bfloat16_t::from_float_rne(src.ptr()[i]);
      else dst.ptr()[i] = static_cast<D>(src.ptr()[i]);  // _Float16 conversion rounds to nearest even
    }
  }
}

template <typename T>
void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& tmp, int32_t count,
               bool calIndex = false) {
  static_assert(detail::is_vec_float<T>(), "ReduceMax supports half/float only");
  detail::check_operand(src, count, "ReduceMax src");
  detail::check_operand(dst, calIndex ? 2 : 1, "ReduceMax dst");
  const uint32_t per_repeat = 256 / sizeof(T);
  const uint32_t need = ((count + per_repeat - 1) / per_repeat * 2 + 32 / sizeof(T) - 1) / (32 / sizeof(T)) * (32 / sizeof(T));
  detail::check_operand(tmp, need, "ReduceMax tmp (too small)");
  detail::count_op();
  T m = src.ptr()[0];
  int32_t idx = 0;
  for (int32_t i = 1; i < count; ++i) {
    if (src.ptr()[i] > m || std::isnan(static_cast<float>(src.ptr()[i]))) {
      m = src.ptr()[i];
      idx = i;
    }
  }
  dst.ptr()[0] = m;
  if (calIndex) std::memcpy(&dst.ptr()[1], &idx, sizeof(T) < 4 ? sizeof(T) : 4);
}
template <typename T>
void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LocalTensor<T>& tmp, int32_t count) {
  static_assert(detail::is_vec_float<T>(), "ReduceSum supports half/float only");
  detail::check_operand(src, count, "ReduceSum src");
  detail::check_operand(dst, 1, "ReduceSum dst");
  const uint32_t per_repeat = 256 / sizeof(T);
  const uint32_t need = ((count + per_repeat - 1) / per_repeat + 32 / sizeof(T) - 1) / (32 / sizeof(T)) * (32 / sizeof(T));
  detail::check_operand(tmp, need, "ReduceSum tmp (too small)");
  detail::count_op();
  // Hardware sums a repeat (256 B) at a time, then the partials: emulate that order in fp32.
  float total = 0.0f;
  for (int32_t r = 0; r < count; r += static_cast<int32_t>(per_repeat)) {
    float part = 0.0f;
    for (int32_t i = r; i < count && i < r + static_cast<int32_t>(per_repeat); ++i) part += static_cast<float>(src.ptr()[i]);
    total += part;
  }
  dst.ptr()[0] = static_cast<T>(total);
}

}  // namespace AscendC

#endif  // SGRPO_EMU_KERNEL_OPERATOR_H
