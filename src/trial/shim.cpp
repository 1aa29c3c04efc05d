// segtune's memory shim: a counting CPU allocator (with an optional trace of
// every allocation and free, and an optional byte cap that raises
// out-of-memory), device-allocator statistics through the device-generic
// at::accelerator API, and autocast control. Compiled by build.rs against the
// libtorch headers of the torch that tch links.
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <malloc.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct TraceEvent {
  uint64_t id;    // allocation id (its order among allocations)
  int64_t bytes;  // > 0: allocation of that size; < 0: free of that size
  uint32_t phase; // caller-defined phase at the time of the event
  uint32_t pad;
};

struct Block {
  size_t bytes;
  uint64_t id;
};

std::mutex g_mu;
std::unordered_map<void*, Block> g_live;
int64_t g_current = 0;
int64_t g_peak = 0;
int64_t g_count = 0;
int64_t g_cap = 0;  // 0: no cap
uint32_t g_phase = 0;
bool g_tracing = false;
std::vector<TraceEvent> g_trace;
bool g_installed = false;
// Tensors kept alive until the storage at the key is freed (see
// segtune_hold_until_freed). Never destroyed: tensors must not be released
// after libtorch has shut down at exit.
auto* g_holds = new std::unordered_map<void*, std::vector<at::Tensor>>();

void counting_delete(void* p) {
  if (!p) return;
  std::vector<at::Tensor> released;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_live.find(p);
    if (it != g_live.end()) {
      g_current -= static_cast<int64_t>(it->second.bytes);
      if (g_tracing) {
        g_trace.push_back({it->second.id, -static_cast<int64_t>(it->second.bytes), g_phase, 0});
      }
      g_live.erase(it);
    }
    auto held = g_holds->find(p);
    if (held != g_holds->end()) {
      released = std::move(held->second);
      g_holds->erase(held);
    }
  }
  c10::free_cpu(p);
  // `released` goes out of scope here, outside the lock: freeing the held
  // tensors re-enters this function.
}

struct CountingAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    {
      std::lock_guard<std::mutex> lk(g_mu);
      if (g_cap > 0 && g_current + static_cast<int64_t>(n) > g_cap) {
        int64_t current = g_current, cap = g_cap;
        // Same exception type as the CUDA allocator's, so callers treat both alike.
        TORCH_CHECK_WITH(OutOfMemoryError, false, "segtune allocation cap: out of memory. Tried to allocate ",
                         n, " bytes with ", current, " bytes in use and a cap of ", cap, " bytes");
      }
    }
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    if (p) {
      std::lock_guard<std::mutex> lk(g_mu);
      uint64_t id = static_cast<uint64_t>(g_count++);
      g_live[p] = {n, id};
      g_current += static_cast<int64_t>(n);
      if (g_current > g_peak) g_peak = g_current;
      if (g_tracing) g_trace.push_back({id, static_cast<int64_t>(n), g_phase, 0});
    }
    // The context must equal the data pointer: libtorch asserts this for CPU storages.
    return {p, p, &counting_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counting_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CountingAllocator g_alloc;

thread_local std::string g_last_error;

template <typename F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return -1;
  }
}

}  // namespace

extern "C" {

void segtune_cpu_alloc_install() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_installed) {
    // Keep freed tensor memory in the heap instead of returning large blocks
    // to the kernel after every op: the same bytes are counted either way,
    // but glibc's per-op mmap/munmap (and page zeroing) of big activations
    // costs as much system time as the maths on a 2-core machine.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    // Priority 255 beats libtorch's default CPU allocator (priority 0).
    c10::SetCPUAllocator(&g_alloc, /*priority=*/255);
    g_installed = true;
  }
}
int64_t segtune_cpu_alloc_current() { std::lock_guard<std::mutex> lk(g_mu); return g_current; }
int64_t segtune_cpu_alloc_peak() { std::lock_guard<std::mutex> lk(g_mu); return g_peak; }
void segtune_cpu_alloc_reset_peak() { std::lock_guard<std::mutex> lk(g_mu); g_peak = g_current; }
int64_t segtune_cpu_alloc_count() { std::lock_guard<std::mutex> lk(g_mu); return g_count; }
void segtune_cpu_alloc_set_cap(int64_t bytes) { std::lock_guard<std::mutex> lk(g_mu); g_cap = bytes; }
void segtune_cpu_alloc_set_phase(uint32_t phase) { std::lock_guard<std::mutex> lk(g_mu); g_phase = phase; }
void segtune_cpu_alloc_trace(bool on) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_tracing = on;
}
// Moves up to `capacity` trace events into `out` (oldest first); returns how many.
size_t segtune_cpu_alloc_trace_take(TraceEvent* out, size_t capacity) {
  std::lock_guard<std::mutex> lk(g_mu);
  size_t n = std::min(capacity, g_trace.size());
  std::copy(g_trace.begin(), g_trace.begin() + n, out);
  g_trace.erase(g_trace.begin(), g_trace.begin() + n);
  return n;
}
size_t segtune_cpu_alloc_trace_len() { std::lock_guard<std::mutex> lk(g_mu); return g_trace.size(); }

const char* segtune_last_error() { return g_last_error.c_str(); }

// Keeps `keep` alive until the storage of `until` is freed, as an autograd
// node that saved both would (PyTorch <= 1.10's softmax kept its input with
// its output). Only storages from the counting allocator can be watched.
int segtune_hold_until_freed(const at::Tensor* keep, const at::Tensor* until) {
  return guarded([&] {
    void* key = until->storage().data_ptr().get();
    std::lock_guard<std::mutex> lk(g_mu);
    TORCH_CHECK(g_live.count(key) == 1, "segtune: the watched tensor is not a counted CPU allocation");
    (*g_holds)[key].push_back(*keep);
  });
}

// Device statistics of the current accelerator (CUDA here).
struct SegtuneDeviceStats {
  int64_t allocated_current, allocated_peak, reserved_current, reserved_peak;
  int64_t requested_peak, num_alloc_retries, num_ooms;
  int64_t free_bytes, total_bytes;
};

int segtune_device_stats(int device, SegtuneDeviceStats* out) {
  return guarded([&] {
    auto s = at::accelerator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const size_t agg = 0;  // StatType::AGGREGATE
    out->allocated_current = s.allocated_bytes[agg].current;
    out->allocated_peak = s.allocated_bytes[agg].peak;
    out->reserved_current = s.reserved_bytes[agg].current;
    out->reserved_peak = s.reserved_bytes[agg].peak;
    out->requested_peak = s.requested_bytes[agg].peak;
    out->num_alloc_retries = s.num_alloc_retries;
    out->num_ooms = s.num_ooms;
    auto info = at::accelerator::getMemoryInfo(static_cast<c10::DeviceIndex>(device));
    out->free_bytes = static_cast<int64_t>(info.first);
    out->total_bytes = static_cast<int64_t>(info.second);
  });
}
int segtune_device_reset_peak(int device) {
  return guarded([&] { at::accelerator::resetPeakStats(static_cast<c10::DeviceIndex>(device)); });
}
int segtune_device_empty_cache() {
  return guarded([&] { at::accelerator::emptyCache(); });
}
int segtune_device_synchronize(int device) {
  return guarded([&] { at::accelerator::synchronizeDevice(static_cast<c10::DeviceIndex>(device)); });
}

// Autocast as torch.autocast(device_type, dtype) enters and leaves it.
// device_type: 0 = CPU, 1 = CUDA; dtype: a c10::ScalarType value.
int segtune_autocast_enter(int device_type, int dtype) {
  return guarded([&] {
    auto dev = device_type == 1 ? at::kCUDA : at::kCPU;
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, static_cast<at::ScalarType>(dtype));
    at::autocast::set_autocast_cache_enabled(true);
    at::autocast::increment_nesting();
  });
}
int segtune_autocast_exit(int device_type) {
  return guarded([&] {
    auto dev = device_type == 1 ? at::kCUDA : at::kCPU;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(dev, false);
  });
}

}  // extern "C"

// In-place ops whose `value` argument tch's generated bindings leave out;
// PyTorch's optimizers call them with it.
extern "C" {
int segtune_addcmul_(at::Tensor* self, const at::Tensor* t1, const at::Tensor* t2, double value) {
  return guarded([&] { self->addcmul_(*t1, *t2, value); });
}
int segtune_addcdiv_(at::Tensor* self, const at::Tensor* t1, const at::Tensor* t2, double value) {
  return guarded([&] { self->addcdiv_(*t1, *t2, value); });
}
}

// torch.nn.utils.clip_grad_norm_ on the foreach path (what it takes on CPU
// and CUDA): per-tensor norms, their norm, one clamped coefficient.
// Returns the total norm, or a negative value on error.
extern "C" double segtune_clip_grad_norm_(at::Tensor** grads, size_t n, double max_norm, double norm_type) {
  double total = -1.0;
  guarded([&] {
    std::vector<at::Tensor> list;
    for (size_t i = 0; i < n; ++i) list.push_back(*grads[i]);
    if (list.empty()) { total = 0.0; return; }
    auto norms = at::_foreach_norm(list, norm_type);
    auto total_norm = at::linalg_vector_norm(at::stack(norms), norm_type);
    auto clip_coef = max_norm / (total_norm + 1e-6);
    auto clamped = at::clamp(clip_coef, c10::nullopt, 1.0);
    at::_foreach_mul_(list, clamped);
    total = total_norm.item<double>();
  });
  return total;
}

// GradScaler.unscale_: torch._amp_foreach_non_finite_check_and_unscale_.
extern "C" int segtune_amp_unscale_(at::Tensor** grads, size_t n, at::Tensor* found_inf, const at::Tensor* inv_scale) {
  return guarded([&] {
    std::vector<at::Tensor> list;
    for (size_t i = 0; i < n; ++i) list.push_back(*grads[i]);
    at::_amp_foreach_non_finite_check_and_unscale_(list, *found_inf, *inv_scale);
  });
}

// `self.add_(other, alpha=alpha)` and `self.add(other, alpha=alpha)`.
extern "C" int segtune_add_alpha_(at::Tensor* self, const at::Tensor* other, double alpha) {
  return guarded([&] { self->add_(*other, alpha); });
}
extern "C" at::Tensor* segtune_add_alpha(const at::Tensor* self, const at::Tensor* other, double alpha) {
  at::Tensor* out = nullptr;
  guarded([&] { out = new at::Tensor(self->add(*other, alpha)); });
  return out;
}
// `param.grad = None` (zero_grad(set_to_none=True)).
extern "C" int segtune_grad_set_none(at::Tensor* self) {
  return guarded([&] { self->mutable_grad() = at::Tensor(); });
}

// CUDA's autocast policy on the CPU. libtorch's CPU autocast casts a
// different set of ops than CUDA's (e.g. CUDA runs softmax, layer_norm and
// upsampling in fp32, CPU autocast does not), so a CPU trace under CPU
// autocast keeps other tensors in half precision than a CUDA run would.
// While enabled, the AutocastCPU dispatch key runs CUDA's policy: the op
// lists and cast rules libtorch's own header gives for CUDA-like devices
// (AT_FORALL_* with at::autocast::WrapFunction), with the CPU as the device
// and every CPU-only autocast kernel made a fallthrough. Disabling drops the
// registrations and libtorch's CPU policy is back.
namespace {

std::unique_ptr<torch::Library> g_cuda_policy;
std::unique_ptr<torch::Library> g_cpu_only_fallthrough;

struct SilentWarnings : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

#define SEGTUNE_LOWER(...) KERNEL(c10::DeviceType::CPU, __VA_ARGS__, lower_precision_fp)
#define SEGTUNE_FP32(...) KERNEL(c10::DeviceType::CPU, __VA_ARGS__, fp32)
#define SEGTUNE_FP32_OPT_DTYPE(...) KERNEL(c10::DeviceType::CPU, __VA_ARGS__, fp32_set_opt_dtype)
#define SEGTUNE_PROMOTE(...) KERNEL(c10::DeviceType::CPU, __VA_ARGS__, promote)
#define SEGTUNE_REDISPATCH(...) KERNEL_DIFFERENT_REDISPATCH_SIGNATURE(c10::DeviceType::CPU, __VA_ARGS__)

void register_cuda_policy(torch::Library& m) {
  using namespace at;  // the header's signatures name Tensor, Scalar, ... unqualified
  AT_FORALL_LOWER_PRECISION_FP(SEGTUNE_LOWER)
  AT_FORALL_FP32(SEGTUNE_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(SEGTUNE_FP32_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(SEGTUNE_REDISPATCH)
  AT_FORALL_PROMOTE(SEGTUNE_PROMOTE)
}

#define SEGTUNE_NAME_1(OP) names.insert("aten::" #OP);
#define SEGTUNE_NAME_2(OP, OVERLOAD) names.insert("aten::" #OP "." #OVERLOAD);
// The trailing `name` stands where KERNEL has the policy, for the header's argument count.
#define SEGTUNE_NAME(...) C10_CONCATENATE(SEGTUNE_NAME_, _KERNEL_OVERLOAD_NARG(__VA_ARGS__, name))(__VA_ARGS__)
#define SEGTUNE_REDISPATCH_NAME(FUNC, REGISTER_NAME, ...) names.insert(std::string("aten::") + REGISTER_NAME);

std::set<std::string> cuda_policy_ops() {
  std::set<std::string> names;
  AT_FORALL_LOWER_PRECISION_FP(SEGTUNE_NAME)
  AT_FORALL_FP32(SEGTUNE_NAME)
  AT_FORALL_FP32_SET_OPT_DTYPE(SEGTUNE_NAME)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(SEGTUNE_REDISPATCH_NAME)
  AT_FORALL_PROMOTE(SEGTUNE_NAME)
  return names;
}

}  // namespace

extern "C" int segtune_autocast_cuda_policy(bool on) {
  return guarded([&] {
    SilentWarnings silent;  // "Overriding a previously registered kernel" is the point
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    if (!on) {
      g_cuda_policy.reset();
      g_cpu_only_fallthrough.reset();
      return;
    }
    if (g_cuda_policy) return;
    auto cuda_ops = cuda_policy_ops();
    auto cpu_ops = c10::Dispatcher::singleton().getRegistrationsForDispatchKey(c10::DispatchKey::AutocastCPU);
    g_cpu_only_fallthrough = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    for (const auto& op : cpu_ops) {
      std::string name = op.name;
      if (!op.overload_name.empty()) name += "." + op.overload_name;
      if (name.rfind("aten::", 0) != 0 || cuda_ops.count(name)) continue;
      g_cpu_only_fallthrough->impl(name.c_str(), torch::CppFunction::makeFallthrough());
    }
    g_cuda_policy = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    register_cuda_policy(*g_cuda_policy);
  });
}
