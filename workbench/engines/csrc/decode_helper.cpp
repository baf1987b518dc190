// A second thread for a decode step's products, awake while the step runs (workbench/engines/
// cpu_kernels.py builds this file with the other kernels; decode_threads.py's `SpinHelper` uses it).
//
// Under passive OpenMP waits (what the workbench sets: spinning threads made torch many times
// slower on a busy machine) a product on two OpenMP threads first wakes the sleeping one, tens of
// microseconds on a VM, and a decode step at a few rows is a few hundred products. This helper is
// one thread that spins between `begin()` and `end()` (the engine brackets each decode step with
// them) and sleeps otherwise: `linear_halves` hands it one half of a product's outputs and runs the
// other half on the calling thread, each on one OpenMP thread, with no wake-up in between.
//
// The halves run the same kernel the whole product would: `kind` 0 oneDNN's packed bf16 linear
// (`mkldnn::_linear_pointwise`), 1 MKL's packed fp32 one (`mkl::_mkl_linear`), 2 `at::linear`.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <omp.h>
#include <torch/library.h>

#include "helper.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <unistd.h>

namespace {

using Clock = std::chrono::steady_clock;

at::Tensor run_linear(int64_t kind, const at::Tensor& x, const at::Tensor& w, const at::Tensor& origin,
                      const std::optional<at::Tensor>& b, int64_t batch) {
  if (kind == 2) return at::linear(x, w, b);
  static const c10::OperatorHandle onednn =
      c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  static const c10::OperatorHandle mkl = c10::Dispatcher::singleton().findSchemaOrThrow("mkl::_mkl_linear", "");
  torch::jit::Stack stack;
  const c10::IValue bias = b.has_value() ? c10::IValue(*b) : c10::IValue();
  if (kind == 0) {
    stack = {x, w, bias, std::string("none"), c10::List<std::optional<at::Scalar>>(), std::string("")};
    onednn.callBoxed(stack);
  } else {
    TORCH_CHECK(kind == 1, "linear_halves: kind 0 (oneDNN), 1 (MKL) or 2 (at::linear), not ", kind);
    stack = {x, w, origin, bias, batch};
    mkl.callBoxed(stack);
  }
  return stack[0].toTensor();
}

// Longest the helper spins without a job while a step is open before it sleeps anyway (a step
// that never calls end(), or a long stretch without products).
constexpr int64_t kMaxIdleSpinNs = 20'000'000;

class Helper {
 public:
  Helper() : thread_([this] { serve(); }) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return ready_; });
  }
  ~Helper() {
    stop_.store(true);
    {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    }
    thread_.join();
  }
  void begin() {
    if (open_.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    }
  }
  void end() { open_.fetch_sub(1); }
  int64_t threads() const { return helper_threads_; }
  int64_t sleeps() const { return sleeps_.load(); }

  // `theirs` on the helper and `mine` here, both to their end (an error of either is rethrown here).
  // Another thread using the helper meanwhile: both here.
  void both(const std::function<void()>& mine, const std::function<void()>& theirs) {
    std::unique_lock<std::mutex> caller(call_mu_, std::try_to_lock);
    if (!caller.owns_lock()) {
      mine();
      theirs();
      return;
    }
    job_ = &theirs, error_ = nullptr;
    state_.store(kPosted);  // seq_cst, as `sleeping_`: the helper sees the job or the caller sees it asleep
    if (sleeping_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
    }
    std::exception_ptr my_error;
    try {
      mine();
    } catch (...) {
      my_error = std::current_exception();
    }
    while (state_.load(std::memory_order_acquire) != kDone) _mm_pause();
    state_.store(kIdle, std::memory_order_relaxed);
    job_ = nullptr;
    if (my_error) std::rethrow_exception(my_error);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  enum { kIdle = 0, kPosted = 1, kDone = 2 };

  void serve() {
    c10::InferenceMode inference;
    at::ones({1 << 16}).sum();  // ATen sets this thread's OpenMP count on its first parallel op: let it,
    omp_set_num_threads(1);     // then run every half on this one thread
    helper_threads_ = omp_get_max_threads();
    {
      std::lock_guard<std::mutex> lk(mu_);
      ready_ = true;
      cv_.notify_all();
    }
    auto last = Clock::now();
    while (!stop_.load(std::memory_order_relaxed)) {
      if (state_.load(std::memory_order_acquire) == kPosted) {
        try {
          (*job_)();
        } catch (...) {
          error_ = std::current_exception();
        }
        state_.store(kDone, std::memory_order_release);
        last = Clock::now();
        continue;
      }
      if (open_.load(std::memory_order_relaxed) > 0 &&
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - last).count() < kMaxIdleSpinNs) {
        _mm_pause();
        continue;
      }
      // asleep until a job, a step opening (unless one is open and idle for too long) or stop
      const bool idle_in_step = open_.load() > 0;
      std::unique_lock<std::mutex> lk(mu_);
      sleeping_.store(true);
      sleeps_.fetch_add(1);
      cv_.wait_for(lk, std::chrono::milliseconds(100), [this, idle_in_step] {
        return state_.load() == kPosted || stop_.load() || (!idle_in_step && open_.load() > 0);
      });
      sleeping_.store(false);
      last = Clock::now();
    }
  }

  std::mutex mu_, call_mu_;
  std::condition_variable cv_;
  bool ready_ = false;
  std::atomic<int> state_{kIdle}, open_{0};
  std::atomic<bool> stop_{false}, sleeping_{false};
  std::atomic<int64_t> sleeps_{0};
  int64_t helper_threads_ = 0;
  const std::function<void()>* job_ = nullptr;  // the posted job (the caller's, alive until kDone)
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the members above exist
};

std::mutex g_mu;
std::unique_ptr<Helper> g_helper;
pid_t g_helper_pid = 0;

Helper& helper() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_helper && g_helper_pid != getpid()) {
    // a forked child: the helper's thread stayed in the parent, so this one (never joinable here)
    // is left as it is and the child starts its own
    g_helper.release();
  }
  if (!g_helper) {
    g_helper = std::make_unique<Helper>();
    g_helper_pid = getpid();
  }
  return *g_helper;
}

at::Tensor linear_halves(int64_t kind, const at::Tensor& x, const at::Tensor& w0, const at::Tensor& w1,
                         const at::Tensor& o0, const at::Tensor& o1, const std::optional<at::Tensor>& b0,
                         const std::optional<at::Tensor>& b1, int64_t batch) {
  at::Tensor first, second;
  helper().both([&] { first = run_linear(kind, x, w0, o0, b0, batch); },
                [&] { second = run_linear(kind, x, w1, o1, b1, batch); });
  return at::cat({first, second}, 1);
}

void helper_begin() { helper().begin(); }
void helper_end() { helper().end(); }
int64_t helper_threads() { return helper().threads(); }
int64_t helper_sleeps() { return helper().sleeps(); }

}  // namespace

namespace workbench_cpu {

void run_both(const std::function<void()>& mine, const std::function<void()>& theirs) { helper().both(mine, theirs); }

}  // namespace workbench_cpu

TORCH_LIBRARY_FRAGMENT(workbench_cpu, m) {
  m.def("linear_halves(int kind, Tensor x, Tensor w0, Tensor w1, Tensor o0, Tensor o1, Tensor? b0, Tensor? b1, "
        "int batch) -> Tensor",
        linear_halves);
  m.def("helper_begin() -> ()", helper_begin);
  m.def("helper_end() -> ()", helper_end);
  m.def("helper_threads() -> int", helper_threads);
  m.def("helper_sleeps() -> int", helper_sleeps);
}
