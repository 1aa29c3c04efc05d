// Autocast control for the Rust trial (`src/trial/memory.rs`), compiled
// with the memory shim (shim.cpp): torch.autocast's enter and exit, and
// CUDA's autocast policy (or an older release's) on the CPU.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "segtune_ffi.h"
#include "shim.h"

#include <memory>
#include <set>
#include <stdexcept>
#include <string>

using segtune_shim::guarded;

extern "C" {

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
// An older release's lists over g_cuda_policy (segtune_autocast_cuda_release).
std::unique_ptr<torch::Library> g_release_overrides;

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
      g_release_overrides.reset();
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

// An older release's CUDA autocast on top of 2.11's policy (see
// autocast_lists.rs): the ops it did not list fall through (they run in the
// dtype they are given), and gelu / grid_sampler, which it ran in fp32, get
// fp32 kernels. Registered after the policy, so these registrations win;
// dropped with it.
extern "C" int segtune_autocast_cuda_release(const char* const* unlisted, int n_unlisted,
                                             bool gelu_fp32, bool grid_sampler_fp32) {
  return guarded([&] {
    SilentWarnings silent;
    c10::WarningUtils::WarningHandlerGuard guard(&silent);
    g_release_overrides.reset();
    if (!g_cuda_policy) throw std::runtime_error("the CUDA autocast policy is not on");
    auto m = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten", c10::DispatchKey::AutocastCPU, __FILE__, __LINE__);
    for (int i = 0; i < n_unlisted; ++i) {
      std::string name = unlisted[i];
      if ((gelu_fp32 && name == "aten::gelu") || (grid_sampler_fp32 && name == "aten::grid_sampler"))
        continue;
      m->impl(name.c_str(), torch::CppFunction::makeFallthrough());
    }
    {
      using namespace at;
      torch::Library& lib = *m;
#define m lib
      if (gelu_fp32) { KERNEL(c10::DeviceType::CPU, gelu, fp32) }
      if (grid_sampler_fp32) { KERNEL(c10::DeviceType::CPU, grid_sampler, fp32) }
#undef m
    }
    g_release_overrides = std::move(m);
  });
}
