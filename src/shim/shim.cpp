// segtune's memory shim: a counting CPU allocator (with an optional trace of
// every allocation and free, and an optional byte cap that raises
// out-of-memory), device-allocator statistics through the device-generic
// at::accelerator API, and the op-level trace (autocast control is in
// shim_autocast.cpp). Compiled by build.rs against the
// libtorch headers of the torch that tch links.
#include <dlfcn.h>
#include <c10/core/AllocatorConfig.h>
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <sys/mman.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "segtune_ffi.h"
#include "shim.h"

#include <malloc.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using TraceEvent = SegtuneTraceEvent;

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
uint32_t g_scope = 0;  // the model part running (models::scope ids)
bool g_tracing = false;
std::vector<TraceEvent> g_trace;
// Events traced since tracing was switched on (taken or not): a kernel
// call's place among them (shim_kernel_calls.cpp).
uint64_t g_trace_index = 0;
bool g_installed = false;
// Op-level tracing (see the section below): 0 off, 1 CPU kernels, 2 meta kernels.
std::atomic<int> g_op_mode{0};
// > 0 while a kernel runs under the op-level fallback on this thread: what
// it allocates is pending, not counted, until the op returns it.
thread_local int t_in_op = 0;
std::unordered_map<void*, size_t> g_pending;
// Tensors kept alive until the storage at the key is freed (see
// segtune_hold_until_freed). Never destroyed: tensors must not be released
// after libtorch has shut down at exit.
auto* g_holds = new std::unordered_map<void*, std::vector<at::Tensor>>();

// Counts (and traces) an allocation of `n` bytes at `p`. Under g_mu.
void count_allocation(void* p, size_t n) {
  uint64_t id = static_cast<uint64_t>(g_count++);
  g_live[p] = {n, id};
  g_current += static_cast<int64_t>(n);
  if (g_current > g_peak) g_peak = g_current;
  if (g_tracing) {
    g_trace.push_back({id, static_cast<int64_t>(n), g_phase, g_scope});
    g_trace_index++;
  }
}

// Uncounts (and traces the free of) the storage at `p`, counted or pending,
// and hands back the tensors held until it was freed: the caller drops them
// outside the lock, since freeing them re-enters the deleters.
std::vector<at::Tensor> forget(void* p) {
  std::vector<at::Tensor> released;
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_live.find(p);
  if (it != g_live.end()) {
    g_current -= static_cast<int64_t>(it->second.bytes);
    if (g_tracing) {
      g_trace.push_back({it->second.id, -static_cast<int64_t>(it->second.bytes), g_phase, g_scope});
      g_trace_index++;
    }
    g_live.erase(it);
  } else {
    g_pending.erase(p);
  }
  auto held = g_holds->find(p);
  if (held != g_holds->end()) {
    released = std::move(held->second);
    g_holds->erase(held);
  }
  return released;
}

void counting_delete(void* p) {
  if (!p) return;
  auto released = forget(p);  // dropped after the free, outside the lock
  c10::free_cpu(p);
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
    if (p && t_in_op > 0 && g_op_mode.load() != 0) {
      std::lock_guard<std::mutex> lk(g_mu);
      g_pending[p] = n;
    } else if (p) {
      std::lock_guard<std::mutex> lk(g_mu);
      count_allocation(p, n);
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

using segtune_shim::guarded;

}  // namespace

void segtune_shim::set_last_error(const std::string& message) { g_last_error = message; }

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
void segtune_cpu_alloc_set_scope(uint32_t scope) { std::lock_guard<std::mutex> lk(g_mu); g_scope = scope; }
void segtune_cpu_alloc_trace(bool on) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (on && !g_tracing) g_trace_index = g_trace.size();
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

// torch.backends.cudnn.benchmark / .deterministic, as MMEngine's env_cfg
// and randomness set them.
// cudaMemGetInfo of `device`, through the CUDA runtime libtorch_cuda has
// loaded (looked up at run time: the build needs no CUDA headers).
int segtune_cuda_mem_info(int device, uint64_t* free_bytes, uint64_t* total_bytes) {
  return guarded([&] {
    using SetDevice = int (*)(int);
    using MemGetInfo = int (*)(size_t*, size_t*);
    void* handle = RTLD_DEFAULT;
    auto set_device = reinterpret_cast<SetDevice>(dlsym(handle, "cudaSetDevice"));
    auto mem_get_info = reinterpret_cast<MemGetInfo>(dlsym(handle, "cudaMemGetInfo"));
    if (!set_device || !mem_get_info) {
      TORCH_CHECK(false, "the CUDA runtime (cudaMemGetInfo) is not loaded in this process");
    }
    TORCH_CHECK(set_device(device) == 0, "cudaSetDevice(", device, ") failed");
    size_t free_b = 0, total_b = 0;
    TORCH_CHECK(mem_get_info(&free_b, &total_b) == 0, "cudaMemGetInfo failed");
    *free_bytes = free_b;
    *total_bytes = total_b;
  });
}

// PYTORCH_CUDA_ALLOC_CONF's settings applied at run time (what
// torch._C._accelerator_setAllocatorSettings does), before the caching
// allocator first serves the device: e.g. per_process_memory_fraction:0.25,
// which setMemoryFraction also sets.
int segtune_cuda_allocator_settings(const char* settings) {
  return guarded([&] { c10::CachingAllocator::setAllocatorSettings(std::string(settings)); });
}

int segtune_cudnn_set_flags(bool benchmark, bool deterministic) {
  return guarded([&] {
    at::globalContext().setBenchmarkCuDNN(benchmark);
    at::globalContext().setDeterministicCuDNN(deterministic);
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

// torch.optim's `_fused_adam` for one device and dtype (Adam/AdamW with
// `fused=True`, transformers' `adamw_torch_fused`): `_foreach_add_(steps, 1)`
// then one `_fused_adam(w)_` over the lists, which updates in place.
extern "C" int segtune_fused_adam_(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs,
                                   at::Tensor** exp_avg_sqs, at::Tensor** steps, size_t n, double lr,
                                   double beta1, double beta2, double weight_decay, double eps,
                                   bool decoupled) {
  return guarded([&] {
    std::vector<at::Tensor> p, g, m, v, s, none;
    for (size_t i = 0; i < n; ++i) {
      p.push_back(*params[i]);
      g.push_back(*grads[i]);
      m.push_back(*exp_avgs[i]);
      v.push_back(*exp_avg_sqs[i]);
      s.push_back(*steps[i]);
    }
    if (p.empty()) return;
    at::_foreach_add_(s, 1);
    if (decoupled) {
      at::_fused_adamw_(p, g, m, v, none, s, lr, beta1, beta2, weight_decay, eps, false, false);
    } else {
      at::_fused_adam_(p, g, m, v, none, s, lr, beta1, beta2, weight_decay, eps, false, false);
    }
  });
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
// `self.histc(bins, min, max)` (tch's generated binding drops min and max).
extern "C" at::Tensor* segtune_histc(const at::Tensor* self, int64_t bins, double min, double max) {
  at::Tensor* out = nullptr;
  guarded([&] { out = new at::Tensor(self->histc(bins, min, max)); });
  return out;
}
// `param.grad = None` (zero_grad(set_to_none=True)).
extern "C" int segtune_grad_set_none(at::Tensor* self) {
  return guarded([&] { self->mutable_grad() = at::Tensor(); });
}

// ---------------------------------------------------------------------------
// Op-level trace. What a GPU allocates for a training step is what every
// backend agrees on: the outputs of each ATen op as dispatched below
// autograd (and their lifetimes, which autograd decides the same way
// everywhere), plus the temporaries of the GPU's own kernels, which the
// predictor models explicitly. A boxed fallback on the `Fake` dispatch key
// (below autograd and autocast, above the backends; unused by libtorch
// itself), switched on for the tracing thread through the thread-local
// included key set, sees every op there and counts only the storages the op
// returns that did not exist before:
//  - mode 1 (CPU): the CPU kernel runs; what it allocates is pending until
//    it returns, then its new output storages are counted and traced and the
//    rest (oneDNN scratch, per-thread buffers) never is.
//  - mode 2 (meta): the op runs on meta copies of its arguments (no data, no
//    compute) and each new output becomes a CPU tensor whose storage is a
//    counted fake allocation (addresses in a reserved, inaccessible range):
//    the same trace as mode 1 in milliseconds and without the host RAM.
//    Values a meta kernel cannot give (`.item()`) are stand-ins: 0.
namespace {

std::unique_ptr<torch::Library> g_fake_fallback;
std::atomic<int64_t> g_stand_ins{0};
std::string g_meta_unsupported;  // first op the meta mode could not run (under g_mu)

// Fake storages: unique addresses inside a PROT_NONE reservation, so that
// code which touches their bytes faults at once instead of corrupting memory.
constexpr size_t kFakeSlot = 256;
constexpr size_t kFakeRegion = size_t(1) << 40;  // 1 TiB of address space, never committed
char* g_fake_base = nullptr;
uint64_t g_fake_next = 0;

void fake_delete(void* p) {
  if (!p) return;
  auto released = forget(p);  // dropped here, outside the lock
}

struct FakeAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    // As the CPU allocator: no bytes, no pointer, nothing counted.
    if (n == 0) return {nullptr, nullptr, &fake_delete, c10::Device(c10::DeviceType::CPU)};
    std::lock_guard<std::mutex> lk(g_mu);
    void* p = g_fake_base + (g_fake_next++ % (kFakeRegion / kFakeSlot)) * kFakeSlot;
    count_allocation(p, n);
    return {p, p, &fake_delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &fake_delete; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "segtune: the data of a traced (meta) tensor was copied");
  }
};
FakeAllocator g_fake_alloc;

template <typename F>
void for_each_tensor(c10::IValue& v, F&& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList()) {
    for (at::Tensor t : v.toTensorList()) f(t);
  } else if (v.isList()) {
    for (const c10::IValue& item : v.toListRef()) {
      if (item.isTensor()) f(item.toTensor());
    }
  }
}

// Maps each tensor inside `v` through `f`, rebuilding lists.
template <typename F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (at::Tensor t : v.toTensorList()) out.push_back(f(t));
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    if (list.elementType()->isSubtypeOf(*c10::OptionalType::ofTensor())) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& item : list) {
        out.push_back(item.isTensor() ? std::optional<at::Tensor>(f(item.toTensor())) : std::nullopt);
      }
      return out;
    }
  }
  return v;
}

void claim_outputs(torch::jit::Stack* stack, size_t returns) {
  std::lock_guard<std::mutex> lk(g_mu);
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    for_each_tensor((*stack)[i], [&](const at::Tensor& t) {
      if (!t.defined() || !t.has_storage()) return;
      void* p = t.storage().data_ptr().get();
      auto it = g_pending.find(p);
      if (it == g_pending.end()) return;
      count_allocation(p, it->second);
      g_pending.erase(it);
    });
  }
}

at::Tensor with_storage(const c10::Storage& storage, c10::DispatchKey key, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), c10::DispatchKeySet(key), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return t;
}

// Ops without a C++ meta kernel (their meta functions live in Python) run
// on the CPU instead, on zero-filled stand-ins of their meta arguments,
// uncounted: the outputs' shapes are what matters. Named in the report.
std::set<std::string> g_cpu_for_meta;  // under g_mu

struct InOp {
  InOp() { t_in_op++; }
  ~InOp() { t_in_op--; }
};

void run_on_cpu_zeros(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first) {
  InOp in_op;  // the stand-ins and the CPU kernel's outputs are never counted
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  std::unordered_map<c10::StorageImpl*, at::Tensor> meta_of_cpu_input;  // CPU storage -> a meta tensor on it
  std::unordered_map<c10::TensorImpl*, at::Tensor> meta_tensor_of_cpu;
  std::unordered_map<c10::StorageImpl*, c10::Storage> cpu_of_meta_storage;
  auto to_zeros = [&](const at::Tensor& m) -> at::Tensor {
    if (!m.defined() || !m.is_meta()) return m;
    auto* ms = m.storage().unsafeGetStorageImpl();
    auto found = cpu_of_meta_storage.find(ms);
    if (found == cpu_of_meta_storage.end()) {
      size_t n = m.storage().nbytes();
      c10::Storage cs(c10::Storage::use_byte_size_t(), n, c10::GetCPUAllocator(), true);
      // Masks all true, everything else zero: every pixel labelled, as the
      // synthetic batch of a prediction has it (no ignored pixels).
      if (n) std::memset(cs.mutable_data(), m.scalar_type() == at::kBool ? 1 : 0, n);
      found = cpu_of_meta_storage.emplace(ms, cs).first;
      meta_of_cpu_input[cs.unsafeGetStorageImpl()] = m;
    }
    at::Tensor c = with_storage(found->second, c10::DispatchKey::CPU, m);
    meta_tensor_of_cpu[c.unsafeGetTensorImpl()] = m;
    return c;
  };
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& arg = (*stack)[first + i];
    if (arg.isDevice()) {
      if (arg.toDevice().is_meta()) arg = c10::IValue(c10::Device(c10::kCPU));
    } else {
      arg = map_tensors(arg, to_zeros);
    }
  }
  op.callBoxed(stack);
  size_t returns = schema.returns().size();
  std::unordered_map<c10::StorageImpl*, c10::Storage> meta_of_new;
  auto to_meta_again = [&](const at::Tensor& c) -> at::Tensor {
    if (!c.defined() || c.is_meta()) return c;
    auto same = meta_tensor_of_cpu.find(c.unsafeGetTensorImpl());
    if (same != meta_tensor_of_cpu.end()) return same->second;
    auto* cs = c.storage().unsafeGetStorageImpl();
    auto input = meta_of_cpu_input.find(cs);
    if (input != meta_of_cpu_input.end()) return with_storage(input->second.storage(), c10::DispatchKey::Meta, c);
    auto made = meta_of_new.find(cs);
    if (made == meta_of_new.end()) {
      c10::Storage ms(c10::Storage::use_byte_size_t(), c.storage().nbytes(), c10::GetAllocator(c10::kMeta), true);
      made = meta_of_new.emplace(cs, ms).first;
    }
    return with_storage(made->second, c10::DispatchKey::Meta, c);
  };
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    (*stack)[i] = map_tensors((*stack)[i], to_meta_again);
  }
}

// Turns a meta op's outputs back into CPU tensors: the argument itself for
// an in-place op, a view of the argument's CPU storage for a view, and a new
// counted fake storage for a new output.
void finish_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                 std::unordered_map<c10::StorageImpl*, c10::Storage>& cpu_of_meta,
                 std::unordered_map<c10::TensorImpl*, at::Tensor>& cpu_tensor_of_meta) {
  size_t returns = op.schema().returns().size();
  std::unordered_map<c10::StorageImpl*, c10::Storage> fake_of_meta;
  auto to_cpu = [&](const at::Tensor& m) -> at::Tensor {
    if (!m.defined() || !m.is_meta()) return m;
    auto same = cpu_tensor_of_meta.find(m.unsafeGetTensorImpl());
    if (same != cpu_tensor_of_meta.end()) return same->second;
    auto* meta_storage = m.storage().unsafeGetStorageImpl();
    auto alias = cpu_of_meta.find(meta_storage);
    if (alias != cpu_of_meta.end()) return with_storage(alias->second, c10::DispatchKey::CPU, m);
    auto fake = fake_of_meta.find(meta_storage);
    if (fake == fake_of_meta.end()) {
      size_t n = m.storage().nbytes();
      c10::Storage st(c10::Storage::use_byte_size_t(), n, g_fake_alloc.allocate(n), &g_fake_alloc, true);
      fake = fake_of_meta.emplace(meta_storage, st).first;
    }
    return with_storage(fake->second, c10::DispatchKey::CPU, m);
  };
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    (*stack)[i] = map_tensors((*stack)[i], to_cpu);
  }
}

// SEGTUNE_OP_TRACE_LOG=1: each op and the trace length after it, on stderr.
const bool g_op_log = std::getenv("SEGTUNE_OP_TRACE_LOG") != nullptr;

void run_on_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  size_t first = stack->size() - nargs;
  if (schema.name() == "aten::_local_scalar_dense") {
    at::Tensor t = (*stack)[first].toTensor();
    stack->resize(first);
    g_stand_ins++;
    // Zero: a finite loss, no inf found by the GradScaler (the step is
    // taken), nothing ignored; only values depend on it, never a shape.
    if (t.scalar_type() == at::kBool) {
      stack->emplace_back(c10::Scalar(false));
    } else if (at::isFloatingType(t.scalar_type())) {
      stack->emplace_back(c10::Scalar(0.0));
    } else {
      stack->emplace_back(c10::Scalar(int64_t(0)));
    }
    return;
  }
  // One meta storage per CPU storage among the arguments, so that views and
  // in-place ops alias on meta as they do on the CPU.
  std::unordered_map<c10::StorageImpl*, c10::Storage> meta_of_cpu;
  std::unordered_map<c10::StorageImpl*, c10::Storage> cpu_of_meta;
  std::unordered_map<c10::TensorImpl*, at::Tensor> cpu_tensor_of_meta;
  auto to_meta = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || t.is_meta()) return t;
    TORCH_CHECK(t.device().is_cpu() && t.layout() == at::kStrided && t.has_storage(),
                "segtune: a meta trace takes strided CPU tensors, not ", t.toString());
    auto* cpu_storage = t.storage().unsafeGetStorageImpl();
    auto found = meta_of_cpu.find(cpu_storage);
    if (found == meta_of_cpu.end()) {
      c10::Storage ms(c10::Storage::use_byte_size_t(), t.storage().nbytes(), c10::GetAllocator(c10::kMeta), true);
      cpu_of_meta[ms.unsafeGetStorageImpl()] = t.storage();
      found = meta_of_cpu.emplace(cpu_storage, ms).first;
    }
    at::Tensor m = with_storage(found->second, c10::DispatchKey::Meta, t);
    cpu_tensor_of_meta[m.unsafeGetTensorImpl()] = t;
    return m;
  };
  for (size_t i = 0; i < nargs; ++i) {
    c10::IValue& arg = (*stack)[first + i];
    const auto& type = schema.arguments()[i].type();
    if (arg.isDevice() || (type->kind() == c10::TypeKind::OptionalType && arg.isDevice())) {
      if (arg.toDevice().is_cpu()) arg = c10::IValue(c10::Device(c10::kMeta));
    } else {
      arg = map_tensors(arg, to_meta);
    }
  }
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    bool has_meta_kernel = true;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      // Usually empty (every op the models run has a meta kernel or a
      // rule): no name is built then.
      has_meta_kernel = g_cpu_for_meta.empty() ||
                        !g_cpu_for_meta.count(schema.operator_name().name + "." + schema.overload_name());
    }
    if (segtune_shim::meta_by_rule(schema.name(), stack, first)) return finish_meta(op, stack, cpu_of_meta, cpu_tensor_of_meta);
    torch::jit::Stack saved(stack->begin() + first, stack->end());
    if (has_meta_kernel) {
      // Real CPU memory a meta kernel allocates (wrapped scalars) is the
      // kernel's own: pending, never counted.
      try {
        InOp in_op;
        op.callBoxed(stack);
      } catch (const c10::Error& e) {
        if (g_op_log) fprintf(stderr, "  meta kernel failed, on CPU stand-ins from now: %s\n", e.what_without_backtrace());
        std::lock_guard<std::mutex> lk(g_mu);
        g_cpu_for_meta.insert(schema.operator_name().name + "." + schema.overload_name());
        has_meta_kernel = false;
      }
    }
    if (!has_meta_kernel) {
      stack->resize(first);
      stack->insert(stack->end(), saved.begin(), saved.end());
      run_on_cpu_zeros(op, stack, first);
    }
  }
  finish_meta(op, stack, cpu_of_meta, cpu_tensor_of_meta);
}



void op_level_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  struct Log {
    const c10::OperatorHandle& op;
    ~Log() {
      if (!g_op_log) return;
      std::lock_guard<std::mutex> lk(g_mu);
      fprintf(stderr, "op %s.%s %zu %ld\n", op.schema().name().c_str(), op.schema().overload_name().c_str(),
              g_trace.size(), static_cast<long>(g_current));
    }
  } log{op};
  c10::impl::ExcludeDispatchKeyGuard not_again(c10::DispatchKey::Fake);
  if (segtune_building_host_data()) {
    // A tensor from host data (models::layers::host): a plain CPU op, untraced.
    op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake), stack);
    return;
  }
  if (g_op_log) {
    size_t nargs = op.schema().arguments().size();
    for (size_t i = stack->size() - nargs; i < stack->size(); ++i) {
      for_each_tensor((*stack)[i], [&](const at::Tensor& t) {
        if (t.defined()) fprintf(stderr, "  in %s %s\n", c10::str(t.sizes()).c_str(), c10::str(t.strides()).c_str());
      });
    }
  }
  // A kernel call the predictor models is recorded after the op's outputs
  // exist, where the CUDA kernel's scratch would be taken.
  std::string call;
  if (segtune_shim::kernel_call_recorded(op)) call = segtune_shim::describe_kernel_call(op, *stack);
  // Every op's bytes, for the step-time model (its arguments are gone from
  // the stack once it has run).
  const bool work = segtune_shim::op_work_recorded();
  const int64_t in_bytes =
      work ? segtune_shim::tensor_bytes(*stack, stack->size() - op.schema().arguments().size()) : 0;
  auto record = [&call, &op, &stack, work, in_bytes] {
    if (call.empty() && !work) return;
    uint64_t at;
    uint32_t phase, scope;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      if (!g_tracing) return;
      at = g_trace_index;
      phase = g_phase;
      scope = g_scope;
    }
    if (!call.empty()) segtune_shim::record_kernel_call(at, phase, scope, call);
    if (work) segtune_shim::record_op_work(phase, op, in_bytes, *stack);
  };
  if (g_op_mode.load() == 2) {
    run_on_meta(op, stack);
    record();
    return;
  }
  {
    InOp in_op;
    op.redispatchBoxed(ks & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, c10::DispatchKey::Fake), stack);
  }
  claim_outputs(stack, op.schema().returns().size());
  record();
}

}  // namespace

extern "C" {
// Switches op-level tracing on this thread: 0 off, 1 CPU kernels, 2 meta.
int segtune_op_trace(int mode) {
  return guarded([&] {
    if (mode != 0 && !g_fake_fallback) {
      if (!g_fake_base) {
        void* region = mmap(nullptr, kFakeRegion, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        TORCH_CHECK(region != MAP_FAILED, "segtune: cannot reserve address space for a meta trace");
        g_fake_base = static_cast<char*>(region);
      }
      g_fake_fallback = std::make_unique<torch::Library>(
          torch::Library::IMPL, "_", c10::DispatchKey::Fake, __FILE__, __LINE__);
      g_fake_fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&op_level_fallback>());
    }
    g_op_mode.store(mode);
    c10::impl::tls_set_dispatch_key_included(c10::DispatchKey::Fake, mode != 0);
  });
}
int64_t segtune_op_trace_stand_ins() { return g_stand_ins.load(); }
// The ops a meta trace ran on the CPU (no C++ meta kernel), comma-separated.
const char* segtune_op_trace_unsupported() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_meta_unsupported.clear();
  for (const auto& name : g_cpu_for_meta) {
    if (!g_meta_unsupported.empty()) g_meta_unsupported += ",";
    g_meta_unsupported += name;
  }
  return g_meta_unsupported.c_str();
}
}
