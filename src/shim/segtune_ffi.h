// The one seam between the C++ shim and Rust: every function with C
// linkage that the shim's translation units (shim.cpp, shim_autocast.cpp,
// shim_checkpoint.cpp, shim_kernel_calls.cpp, shim_psamask.cpp) export,
// and the one Rust exports to them. Each shim*.cpp includes this header, so
// the compiler checks every definition against its prototype here (and
// -Wmissing-declarations flags an export missing from it); `src/shim/ffi.rs`
// declares the same functions for Rust, in the same order.
//
// Conventions: a function returning `int` returns 0, or -1 with the error's
// text for `segtune_last_error` (on the calling thread); one returning a
// pointer returns null on error, likewise. Tensors are `at::Tensor*`, what
// tch's `C_tensor*` is; a returned tensor is a new heap tensor the caller owns.
#pragma once

#include <cstddef>
#include <cstdint>

namespace at {
class Tensor;
}

extern "C" {

// ---------------------------------------------------------------------------
// Errors (shim.cpp).

// The text of this thread's last failed call; valid until its next call.
const char* segtune_last_error();

// ---------------------------------------------------------------------------
// The counting CPU allocator and its trace (shim.cpp).

// One allocator event, as Rust's `trial::trace::TraceEvent`.
struct SegtuneTraceEvent {
  uint64_t id;     // allocation id (its order among allocations)
  int64_t bytes;   // > 0: allocation of that size; < 0: free of that size
  uint32_t phase;  // caller-defined phase at the time of the event
  uint32_t scope;  // the model part running (models::scope ids)
};

void segtune_cpu_alloc_install();
int64_t segtune_cpu_alloc_current();
int64_t segtune_cpu_alloc_peak();
void segtune_cpu_alloc_reset_peak();
int64_t segtune_cpu_alloc_count();
void segtune_cpu_alloc_set_cap(int64_t bytes);
void segtune_cpu_alloc_set_phase(uint32_t phase);
void segtune_cpu_alloc_set_scope(uint32_t scope);
void segtune_cpu_alloc_trace(bool on);
size_t segtune_cpu_alloc_trace_take(SegtuneTraceEvent* out, size_t capacity);
size_t segtune_cpu_alloc_trace_len();
int segtune_hold_until_freed(const at::Tensor* keep, const at::Tensor* until);

// ---------------------------------------------------------------------------
// The device's caching allocator and CUDA settings (shim.cpp).

// Device statistics of the current accelerator (CUDA here).
struct SegtuneDeviceStats {
  int64_t allocated_current, allocated_peak, reserved_current, reserved_peak;
  int64_t requested_peak, num_alloc_retries, num_ooms;
  int64_t free_bytes, total_bytes;
};

int segtune_device_stats(int device, SegtuneDeviceStats* out);
int segtune_device_reset_peak(int device);
int segtune_device_empty_cache();
int segtune_device_synchronize(int device);
int segtune_cuda_mem_info(int device, uint64_t* free_bytes, uint64_t* total_bytes);
int segtune_cuda_allocator_settings(const char* settings);
int segtune_cudnn_set_flags(bool benchmark, bool deterministic);

// ---------------------------------------------------------------------------
// Autocast (shim_autocast.cpp). device_type: 0 = CPU, 1 = CUDA; dtype: a c10::ScalarType.

int segtune_autocast_enter(int device_type, int dtype);
int segtune_autocast_exit(int device_type);
int segtune_autocast_cuda_policy(bool on);
int segtune_autocast_cuda_release(const char* const* unlisted, int n_unlisted, bool gelu_fp32,
                                  bool grid_sampler_fp32);

// ---------------------------------------------------------------------------
// Ops tch's bindings lack or call without an argument (shim.cpp, shim_psamask.cpp).

int segtune_addcmul_(at::Tensor* self, const at::Tensor* t1, const at::Tensor* t2, double value);
int segtune_addcdiv_(at::Tensor* self, const at::Tensor* t1, const at::Tensor* t2, double value);
// The total norm, or a negative value on error.
double segtune_clip_grad_norm_(at::Tensor** grads, size_t n, double max_norm, double norm_type);
int segtune_fused_adam_(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs, at::Tensor** exp_avg_sqs,
                        at::Tensor** steps, size_t n, double lr, double beta1, double beta2, double weight_decay,
                        double eps, bool decoupled);
int segtune_amp_unscale_(at::Tensor** grads, size_t n, at::Tensor* found_inf, const at::Tensor* inv_scale);
int segtune_add_alpha_(at::Tensor* self, const at::Tensor* other, double alpha);
at::Tensor* segtune_add_alpha(const at::Tensor* self, const at::Tensor* other, double alpha);
at::Tensor* segtune_histc(const at::Tensor* self, int64_t bins, double min, double max);
int segtune_grad_set_none(at::Tensor* self);
at::Tensor* segtune_psamask(const at::Tensor* input, bool collect, int64_t h_mask, int64_t w_mask, bool values);

// ---------------------------------------------------------------------------
// The op-level trace (shim.cpp) and its kernel calls (shim_kernel_calls.cpp).

int segtune_op_trace(int mode);
int64_t segtune_op_trace_stand_ins();
const char* segtune_op_trace_unsupported();
int segtune_kernel_calls_record(const char* ops);
const char* segtune_kernel_calls_take();

// ---------------------------------------------------------------------------
// Gradient checkpointing (shim_checkpoint.cpp): a Rust block run through C.

// Runs the block on `n` inputs (`recompute`: 1 in the backward's re-run);
// a new heap tensor, or null with `segtune_block_set_error` called.
typedef at::Tensor* (*segtune_block_run)(void* block, const at::Tensor* const* inputs, size_t n, int recompute);
// Drops the block; called once, when the graph node that holds it goes.
typedef void (*segtune_block_release)(void* block);

void segtune_block_set_error(const char* message);
at::Tensor* segtune_checkpoint(const at::Tensor* const* inputs, size_t n, void* block, segtune_block_run run,
                               segtune_block_release release);

// ---------------------------------------------------------------------------
// Exported by Rust (src/models/layers/host.rs).

// Whether this thread is building a tensor from host data (the op-level
// trace then runs the op untraced).
bool segtune_building_host_data();

}  // extern "C"
