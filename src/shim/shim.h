// What the shim's translation units (shim.cpp, shim_checkpoint.cpp,
// shim_meta_rules.cpp, shim_psamask.cpp, shim_kernel_calls.cpp,
// shim_autocast.cpp) share
// inside C++; what they export to Rust is in segtune_ffi.h.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>

#include <cstddef>
#include <exception>
#include <string>

namespace segtune_shim {

// Records the error of a failed call on this thread (`segtune_last_error`).
void set_last_error(const std::string& message);

// Runs `f`; 0, or -1 with the exception's text recorded. No exception
// may cross into Rust: that would abort the worker without a report.
template <typename F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return -1;
  } catch (...) {
    set_last_error("unknown C++ exception (not a std::exception)");
    return -1;
  }
}

// The outputs of `name` as meta tensors, by segtune's shape rule
// (shim_meta_rules.cpp), replacing its arguments from `first` on the stack;
// false for an op without a rule.
bool meta_by_rule(const std::string& name, torch::jit::Stack* stack, size_t first);

// Kernel calls (shim_kernel_calls.cpp): whether `op` is one to record, its
// arguments as one line (before the op runs), and the record itself.
bool kernel_call_recorded(const c10::OperatorHandle& op);
std::string describe_kernel_call(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
void record_kernel_call(uint64_t at_event, uint32_t phase, uint32_t scope, const std::string& call);
// Whether every op's work is recorded (while kernel calls are: an op-level
// trace), and the bytes of the tensors among the op's arguments or returns.
bool op_work_recorded();
int64_t tensor_bytes(const torch::jit::Stack& stack, size_t first);
// One op's work (`w PHASE OP IN_BYTES OUT_BYTES VIEW`), for the step-time
// model: `returns` are the top of `stack` once the op has run.
void record_op_work(uint32_t phase, const c10::OperatorHandle& op, int64_t in_bytes,
                    const torch::jit::Stack& stack);

}  // namespace segtune_shim
