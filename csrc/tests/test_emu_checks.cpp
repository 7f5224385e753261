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

int main() {
  static float gm[4096];
  expect_error("ub overflow", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a, b;
    pipe.InitBuffer(a, 128 * 1024);
    pipe.InitBuffer(b, 96 * 1024);
  }, "UB overflow");
  expect_error("unaligned InitBuffer", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a;
    pipe.InitBuffer(a, 100);
  }, "multiple of 32");
  expect_error("unaligned vector operand", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a;
    pipe.InitBuffer(a, 1024);
    LocalTensor<float> t = a.Get<float>();
    Adds(t[3], t[3], 1.0f, 8);
  }, "not 32 B aligned");
  expect_error("count beyond tensor", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a;
    pipe.InitBuffer(a, 64);
    LocalTensor<float> t = a.Get<float>();
    Exp(t, t, 17);
  }, "exceeds tensor size");
  expect_error("DataCopy of a partial block", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a;
    pipe.InitBuffer(a, 1024);
    GlobalTensor<float> g;
    g.SetGlobalBuffer(gm, 4096);
    DataCopy(a.Get<float>(), g, 10);
  }, "use DataCopyPad");
  expect_error("DeQue from empty queue", [] {
    TPipe pipe;
    TQue<QuePosition::VECIN, 2> q;
    pipe.InitBuffer(q, 2, 256);
    LocalTensor<float> t = q.DeQue<float>();
    (void)t;
  }, "empty queue");
  expect_error("AllocTensor beyond buffer count", [] {
    TPipe pipe;
    TQue<QuePosition::VECIN, 2> q;
    pipe.InitBuffer(q, 2, 256);
    LocalTensor<float> a = q.AllocTensor<float>();
    LocalTensor<float> b = q.AllocTensor<float>();
    LocalTensor<float> c = q.AllocTensor<float>();
    (void)a, (void)b, (void)c;
  }, "deadlock");
  expect_error("buffer leaked at kernel end", [] {
    TPipe pipe;
    TQue<QuePosition::VECIN, 2> q;
    pipe.InitBuffer(q, 2, 256);
    LocalTensor<float> a = q.AllocTensor<float>();
    q.EnQue(a);
  }, "still held");
  expect_error("WaitFlag without SetFlag", [] {
    TPipe pipe;
    WaitFlag<HardEvent::V_S>(0);
  }, "WaitFlag");
  expect_error("GM read past the buffer", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a;
    pipe.InitBuffer(a, 1024);
    GlobalTensor<float> g;
    g.SetGlobalBuffer(gm, 16);
    DataCopyExtParams p{1, 20 * 4, 0, 0, 0};
    DataCopyPad(a.Get<float>(), g, p, DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
  }, "reads past");
  expect_error("two cores write the same GM bytes", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a;
    pipe.InitBuffer(a, 256);
    GlobalTensor<float> g;
    g.SetGlobalBuffer(gm, 4096);
    Duplicate(a.Get<float>(), 1.0f, 64);
    DataCopy(g[GetBlockIdx() * 32], a.Get<float>(), 64);  // cores overlap by 32 floats
  }, "written by core", 2);
  // A correct two-core program passes and the tail of a DataCopyPad block reads as NaN (undefined on hardware).
  expect_ok("disjoint cores + pad", [] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> a;
    pipe.InitBuffer(a, 256);
    GlobalTensor<float> g;
    g.SetGlobalBuffer(gm, 4096);
    DataCopyExtParams p{1, 5 * 4, 0, 0, 0};
    LocalTensor<float> t = a.Get<float>();
    DataCopyPad(t, g, p, DataCopyPadExtParams<float>{false, 0, 0, 0.0f});
    if (!std::isnan(t.GetValue(6))) throw sgrpo_emu::EmuError("pad bytes were not poisoned");
    DataCopyPad(g[1000 + GetBlockIdx() * 5], t, p);
  }, 2);
  std::printf("emu checks: %d ok, %d failures\n", g_ok, g_fail);
  return g_fail == 0 ? 0 : 1;
}
