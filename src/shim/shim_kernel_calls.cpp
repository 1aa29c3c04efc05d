// Kernel calls of an op-level trace: for the ops whose CUDA kernels choose
// an algorithm or take scratch memory through the caching allocator (cuDNN's
// convolutions, reductions, losses, ...), the op's arguments as the
// predictor needs them (dtype, sizes, channels-last or not, the scalar and
// list arguments), at its place among the trace's events. The predictor
// (src/predict/kernels/) turns each into the transient allocations the CUDA
// kernel would make there. Which ops are recorded is Rust's list
// (trial::kernel_calls::RECORDED_OPS).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "segtune_ffi.h"
#include "shim.h"

#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::mutex g_calls_mu;
std::set<std::string> g_recorded;  // op names, "aten::convolution" or "aten::sum.dim_IntList"
std::vector<std::string> g_calls;  // one formatted line per call
std::string g_taken;

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "f32";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    case at::kDouble: return "f64";
    case at::kLong: return "i64";
    case at::kInt: return "i32";
    case at::kBool: return "bool";
    case at::kByte: return "u8";
    default: return "other";
  }
}

void write_tensor(std::ostringstream& out, const at::Tensor& t) {
  if (!t.defined()) {
    out << " -";
    return;
  }
  out << " t:" << dtype_name(t.scalar_type()) << ":";
  auto sizes = t.sizes();
  if (sizes.empty()) out << "s";
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? "x" : "") << sizes[i];
  // The layout a CUDA kernel sees: channels-last 4-d tensors (cuDNN NHWC,
  // native kernels' channels-last paths), else contiguous or strided.
  if (sizes.size() == 4 && t.suggest_memory_format() == at::MemoryFormat::ChannelsLast &&
      !t.is_contiguous()) {
    out << ":cl";
  } else if (!t.is_contiguous()) {
    out << ":nc";
  }
}

void write_value(std::ostringstream& out, const c10::IValue& v) {
  if (v.isNone()) {
    out << " -";
  } else if (v.isTensor()) {
    write_tensor(out, v.toTensor());
  } else if (v.isBool()) {
    out << " b:" << (v.toBool() ? 1 : 0);
  } else if (v.isInt()) {
    out << " i:" << v.toInt();
  } else if (v.isDouble()) {
    out << " f:" << v.toDouble();
  } else if (v.isIntList()) {
    out << " l:";
    auto list = v.toIntVector();
    if (list.empty()) out << "e";
    for (size_t i = 0; i < list.size(); ++i) out << (i ? "," : "") << list[i];
  } else if (v.isBoolList()) {
    out << " m:";
    auto list = v.toBoolList();
    for (size_t i = 0; i < list.size(); ++i) out << (i ? "," : "") << (list.get(i) ? 1 : 0);
  } else if (v.isTensorList()) {
    // Only the count and the first tensor (foreach ops: the count matters).
    auto list = v.toTensorList();
    out << " n:" << list.size();
  } else if (v.isScalar()) {
    out << " f:" << v.toScalar().toDouble();
  } else {
    out << " ?";
  }
}

}  // namespace

namespace segtune_shim {

bool kernel_call_recorded(const c10::OperatorHandle& op) {
  std::lock_guard<std::mutex> lk(g_calls_mu);
  if (g_recorded.empty()) return false;
  const auto& schema = op.schema();
  if (g_recorded.count(schema.name())) return true;
  return !schema.overload_name().empty() && g_recorded.count(schema.name() + "." + schema.overload_name());
}

std::string describe_kernel_call(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& schema = op.schema();
  size_t nargs = schema.arguments().size();
  std::ostringstream out;
  out << schema.name();
  if (!schema.overload_name().empty()) out << "." << schema.overload_name();
  for (size_t i = stack.size() - nargs; i < stack.size(); ++i) write_value(out, stack[i]);
  return out.str();
}

bool op_work_recorded() {
  std::lock_guard<std::mutex> lk(g_calls_mu);
  return !g_recorded.empty();
}

int64_t tensor_bytes(const torch::jit::Stack& stack, size_t first) {
  int64_t bytes = 0;
  auto add = [&bytes](const at::Tensor& t) {
    if (t.defined()) bytes += static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
  };
  for (size_t i = first; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      add(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) add(t);
    } else if (v.isList()) {
      for (const c10::IValue& item : v.toListRef()) {
        if (item.isTensor()) add(item.toTensor());
      }
    }
  }
  return bytes;
}

void record_op_work(uint32_t phase, const c10::OperatorHandle& op, int64_t in_bytes,
                    const torch::jit::Stack& stack) {
  const auto& schema = op.schema();
  const auto& returns = schema.returns();
  // A view (every return aliases an argument, none written) launches no
  // kernel on CUDA; an in-place or out= op writes its alias and does.
  bool view = !returns.empty();
  for (const auto& r : returns) {
    if (!r.alias_info() || r.alias_info()->isWrite()) view = false;
  }
  size_t first = stack.size() >= returns.size() ? stack.size() - returns.size() : 0;
  int64_t out_bytes = view ? 0 : tensor_bytes(stack, first);
  std::ostringstream line;
  line << "w " << phase << " " << schema.name();
  if (!schema.overload_name().empty()) line << "." << schema.overload_name();
  line << " " << in_bytes << " " << out_bytes << " " << (view ? 1 : 0);
  std::lock_guard<std::mutex> lk(g_calls_mu);
  g_calls.push_back(line.str());
}

void record_kernel_call(uint64_t at_event, uint32_t phase, uint32_t scope, const std::string& call) {
  std::ostringstream line;
  line << "k " << at_event << " " << phase << " " << scope << " " << call;
  std::lock_guard<std::mutex> lk(g_calls_mu);
  g_calls.push_back(line.str());
}

}  // namespace segtune_shim

extern "C" {
// The ops to record, comma-separated (empty: none). Clears recorded calls.
int segtune_kernel_calls_record(const char* ops) {
  return segtune_shim::guarded([&] {
    std::lock_guard<std::mutex> lk(g_calls_mu);
    g_recorded.clear();
    g_calls.clear();
    std::string list = ops ? ops : "";
    size_t start = 0;
    while (start < list.size()) {
      size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      if (end > start) g_recorded.insert(list.substr(start, end - start));
      start = end + 1;
    }
  });
}
// Every call recorded so far, one line each (`k AT PHASE SCOPE OP ARGS...`),
// and forgets them. The string lives until the next call.
const char* segtune_kernel_calls_take() {
  std::lock_guard<std::mutex> lk(g_calls_mu);
  g_taken.clear();
  for (const auto& line : g_calls) {
    g_taken += line;
    g_taken += '\n';
  }
  g_calls.clear();
  return g_taken.c_str();
}
}
