// Gradient checkpointing for the Rust models (`src/models/layers/checkpoint.rs`),
// compiled with the memory shim (shim.cpp).
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "segtune_ffi.h"
#include "shim.h"

using segtune_shim::guarded;

// Gradient checkpointing as torch.utils.checkpoint's reentrant variant
// (CheckpointFunction, what `cp.checkpoint(f, x)` runs in torch 2.11 when
// use_reentrant is not passed): the forward runs the block without grad and
// keeps only its inputs (and the CPU RNG state); the backward re-runs it with
// grad on detached inputs under the forward's autocast state and RNG state,
// back-propagates through the recomputed graph, and returns the inputs'
// gradients. The block is a Rust closure (`run`), released with `release`
// after the backward, or when the graph node goes without one.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <ATen/CPUGeneratorImpl.h>

namespace {

// The Rust block, owned here from `segtune_checkpoint` on: released (its
// `release` called, once) when the last reference goes, the graph node's
// saved data (after its backward, or with the graph if none runs) or the
// call's own on a failed forward.
struct RustBlock : torch::CustomClassHolder {
  RustBlock(void* block, segtune_block_run run, segtune_block_release release)
      : block_(block), run_(run), release_(release) {}
  RustBlock(const RustBlock&) = delete;
  RustBlock& operator=(const RustBlock&) = delete;
  ~RustBlock() override { release_(block_); }

  at::Tensor operator()(at::TensorList inputs, bool recompute) const {
    std::vector<const at::Tensor*> ptrs;
    for (const auto& t : inputs) ptrs.push_back(&t);
    at::Tensor* out = run_(block_, ptrs.data(), ptrs.size(), recompute ? 1 : 0);
    TORCH_CHECK(out != nullptr, "the checkpointed block failed: ", block_error());
    at::Tensor result = std::move(*out);
    delete out;
    return result;
  }

  // The text the failing block left (segtune_block_set_error), on this thread.
  static std::string& block_error() {
    thread_local std::string text;
    return text;
  }

 private:
  void* block_;
  segtune_block_run run_;
  segtune_block_release release_;
};

const char kBlockKey[] = "block";

struct AutocastState {
  bool enabled;
  at::ScalarType dtype;
};

const c10::DeviceType kAutocastDevices[] = {c10::DeviceType::CPU, c10::DeviceType::CUDA};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                                                const c10::intrusive_ptr<RustBlock>& block) {
    ctx->saved_data[kBlockKey] = c10::IValue::make_capsule(block);
    for (auto device : kAutocastDevices) {
      std::string key = std::string("autocast_") + c10::DeviceTypeName(device, true);
      ctx->saved_data[key] = at::autocast::is_autocast_enabled(device);
      ctx->saved_data[key + "_dtype"] = at::autocast::get_autocast_dtype(device);
    }
    ctx->saved_data["cache_enabled"] = at::autocast::is_autocast_cache_enabled();
    {
      // torch.get_rng_state(): a copy of the CPU generator's state, kept for backward.
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["cpu_rng_state"] = gen.get_state();
    }
    ctx->save_for_backward(inputs.vec());
    at::NoGradGuard no_grad;
    return {(*block)(inputs, false)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved_block = ctx->saved_data.find(kBlockKey);
    TORCH_CHECK(saved_block != ctx->saved_data.end(), "a checkpointed block ran backward twice");
    c10::intrusive_ptr<torch::CustomClassHolder> holder = saved_block->second.toCapsule();
    // One backward per forward (retain_graph is never used): the block goes
    // when this backward returns, not with the graph.
    ctx->saved_data.erase(saved_block);
    const auto* block = static_cast<const RustBlock*>(holder.get());
    auto saved = ctx->get_saved_variables();
    auto gen = at::detail::getDefaultCPUGenerator();
    at::Tensor rng_before;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng_before = gen.get_state();  // torch.random.fork_rng
      gen.set_state(ctx->saved_data["cpu_rng_state"].toTensor());
    }
    std::vector<at::Tensor> detached;
    for (const auto& input : saved) {
      at::Tensor d = input.detach();
      d.set_requires_grad(input.requires_grad());
      detached.push_back(d);
    }
    at::Tensor output;
    {
      at::AutoGradMode enable_grad(true);
      std::vector<AutocastState> previous;
      bool cache_before = at::autocast::is_autocast_cache_enabled();
      for (auto device : kAutocastDevices) {
        std::string key = std::string("autocast_") + c10::DeviceTypeName(device, true);
        previous.push_back({at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)});
        at::autocast::set_autocast_enabled(device, ctx->saved_data[key].toBool());
        at::autocast::set_autocast_dtype(device, ctx->saved_data[key + "_dtype"].toScalarType());
        at::autocast::increment_nesting();
      }
      at::autocast::set_autocast_cache_enabled(ctx->saved_data["cache_enabled"].toBool());
      try {
        output = (*block)(detached, true);
      } catch (...) {
        for (size_t i = 0; i < 2; ++i) at::autocast::decrement_nesting();
        throw;
      }
      for (size_t i = 0; i < 2; ++i) {
        auto device = kAutocastDevices[1 - i];
        if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        at::autocast::set_autocast_enabled(device, previous[1 - i].enabled);
        at::autocast::set_autocast_dtype(device, previous[1 - i].dtype);
      }
      at::autocast::set_autocast_cache_enabled(cache_before);
    }
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng_before);
    }
    if (output.requires_grad()) {
      torch::autograd::backward({output}, {grad_outputs[0]});
    }
    torch::autograd::variable_list grads;
    for (const auto& d : detached) grads.push_back(d.grad());
    grads.push_back(at::Tensor());
    return grads;
  }
};

}  // namespace

extern "C" {

// The error text a failing block callback leaves for the C++ side.
void segtune_block_set_error(const char* message) { RustBlock::block_error() = message ? message : ""; }

// `cp.checkpoint(block, *inputs)`; null (and segtune_last_error) on failure.
// Owns `block` from here on, whatever happens: `release` drops it once.
at::Tensor* segtune_checkpoint(const at::Tensor* const* inputs, size_t n, void* block, segtune_block_run run,
                               segtune_block_release release) {
  auto owned = c10::make_intrusive<RustBlock>(block, run, release);
  at::Tensor* out = nullptr;
  guarded([&] {
    std::vector<at::Tensor> args;
    for (size_t i = 0; i < n; ++i) args.push_back(*inputs[i]);
    out = new at::Tensor(CheckpointFunction::apply(at::TensorList(args), owned)[0]);
  });
  return out;
}

}  // extern "C"
