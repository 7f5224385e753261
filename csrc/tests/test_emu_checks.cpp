// Self-test of the CPU test double csrc/emu/kernel_operator.h: each misuse below must be caught (driven by
// tests/test_ascend_emu.py; by hand: g++ -std=c++17 -DSGRPO_EMU -I csrc/emu csrc/tests/test_emu_checks.cpp && ./a.out).
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "kernel_operator.h"

using namespace AscendC;

static int g_fail = 0, g_ok = 0;

static void expect_error(const char* name, const std::function<void()>& body, const char* needle,
                         uint32_t cores = 1) {
  try {
    sgrpo_emu::launch(cores, body);
  } catch (const sgrpo_emu::EmuError& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) {
      ++g_ok;
      return;
    }
    std::printf("FAIL %s: wrong error: %s\n", name, e.what());
    ++g_fail;
    return;
  }
  std::printf("FAIL %s: no error raised\n", name);
  ++g_fail;
}

static void expect_ok(const char* name, const std::function<void()>& body, uint32_t cores = 1) {
  try {
    sgrpo_emu::launch(cores, body);
    ++g_ok;
  } catch (const sgrpo_emu::EmuError& e) {
    std::printf("FAIL %s: %s\n", name, e.what());
    ++g_fail;
  }
}

// What most cases start from: a pipe with one VECCALC buffer of `bytes`, or with one VECIN queue of two 256 B buffers
// (members die in reverse order, queue before pipe, as locals would), and a GM tensor over the first `size` floats of gm.
static float gm[4096];

struct OneBuffer {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  explicit OneBuffer(uint32_t bytes) { pipe.InitBuffer(buf, bytes); }
  LocalTensor<float> ub() const { return buf.Get<float>(); }
};

struct OneQueue {
  TPipe pipe;
  TQue<QuePosition::VECIN, 2> q;
  OneQueue() { pipe.InitBuffer(q, 2, 256); }
};

static GlobalTensor<float> Gm(uint64_t size) {
  GlobalTensor<float> g;
  g.SetGlobalBuffer(gm, size);
  return g;
}

int main() {
  expect_error("ub overflow", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a, b;
    pipe.InitBuffer(a, 128 * 1024);
    pipe.InitBuffer(b, 96 * 1024);
  }, "UB overflow");
  expect_error("unaligned InitBuffer", [] { OneBuffer u(100); }, "multiple of 32");
  expect_error("unaligned vector operand", [] {
    OneBuffer u(1024);
    Adds(u.ub()[3], u.ub()[3], 1.0f, 8);
  }, "not 32 B aligned");
  expect_error("count beyond tensor", [] {
    OneBuffer u(64);
    Exp(u.ub(), u.ub(), 17);
  }, "exceeds tensor size");
  expect_error("DataCopy of a partial block", [] {
    OneBuffer u(1024);
    DataCopy(u.ub(), Gm(4096), 10);
  }, "use DataCopyPad");
  expect_error("DeQue from empty queue", [] {
    OneQueue u;
    LocalTensor<float> t = u.q.DeQue<float>();
    (void)t;
  }, "empty queue");
  expect_error("AllocTensor beyond buffer count", [] {
    OneQueue u;
    LocalTensor<float> a = u.q.AllocTensor<float>();
    LocalTensor<float> b = u.q.AllocTensor<float>();
    LocalTensor<float> c = u.q.AllocTensor<float>();
    (void)a, (void)b, (void)c;
  }, "deadlock");
  expect_error("buffer leaked at kernel end", [] {
    OneQueue u;
    u.q.EnQue(u.q.AllocTensor<float>());
  }, "still held");
  expect_error("WaitFlag without SetFlag", [] {
    TPipe pipe;
    WaitFlag<HardEvent::V_S>(0);
  }, "WaitFlag");
  expect_error("GM read past the buffer", [] {
    OneBuffer u(1024);
    DataCopyExtParams p{1, 20 * 4, 0, 0, 0};
    DataCopyPad(u.ub(), Gm(16), p, DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
  }, "reads past");
  expect_error("two cores write the same GM bytes", [] {
    OneBuffer u(256);
    Duplicate(u.ub(), 1.0f, 64);
    DataCopy(Gm(4096)[GetBlockIdx() * 32], u.ub(), 64);  // cores overlap by 32 floats
  }, "written by core", 2);
  // A correct two-core program passes and the tail of a DataCopyPad block reads as NaN (undefined on hardware).
  expect_ok("disjoint cores + pad", [] {
    OneBuffer u(256);
    DataCopyExtParams p{1, 5 * 4, 0, 0, 0};
    LocalTensor<float> t = u.ub();
    DataCopyPad(t, Gm(4096), p, DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
    if (!std::isnan(t.GetValue(6))) throw sgrpo_emu::EmuError("pad bytes were not poisoned");
    DataCopyPad(Gm(4096)[1000 + GetBlockIdx() * 5], t, p);
  }, 2);
  std::printf("emu checks: %d ok, %d failures\n", g_ok, g_fail);
  return g_fail == 0 ? 0 : 1;
}
