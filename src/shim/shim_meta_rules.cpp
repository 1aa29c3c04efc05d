// Shape rules of the op-level meta trace (shim.cpp's fallback): the outputs
// of the ops whose meta functions live only in Python.
#include <ATen/ATen.h>
#include <ATen/TensorIterator.h>
#include <ATen/core/stack.h>

#include <array>
#include <string>
#include <unordered_set>
#include <vector>

#include "segtune_ffi.h"
#include "shim.h"

namespace {

// Shapes of the ops whose meta functions live in Python (torch/_meta_registrations.py),
// for the ops the models run: each gives the outputs the CPU kernel allocates
// (sizes, dtype, memory format), as meta tensors. Returns false for an op it
// does not know, which then runs on CPU stand-ins.
at::Tensor meta_empty_like(const at::Tensor& t, at::MemoryFormat format) {
  return at::empty(t.sizes(), t.options().device(c10::kMeta).memory_format(format));
}
at::Tensor meta_empty(at::IntArrayRef sizes, const at::Tensor& like, c10::ScalarType dtype) {
  return at::empty(sizes, like.options().device(c10::kMeta).dtype(dtype).memory_format(at::MemoryFormat::Contiguous));
}
c10::ScalarType stats_dtype(const at::Tensor& input, const c10::IValue& param) {
  // CPU norms keep statistics in the parameters' type when they are fp32
  // and the input is reduced precision ("mixed type"), else in the input's.
  if (param.isTensor() && param.toTensor().defined() && param.toTensor().scalar_type() == at::kFloat &&
      at::isReducedFloatingType(input.scalar_type())) {
    return at::kFloat;
  }
  return input.scalar_type();
}
void push_outputs(torch::jit::Stack* stack, size_t first, std::initializer_list<at::Tensor> outs) {
  stack->resize(first);
  for (const auto& t : outs) stack->emplace_back(t);
}

// A convolution runs channels-last when its input or weight is, and so are
// its outputs and gradients (mkldnn on the CPU, cuDNN on CUDA alike).
at::MemoryFormat conv_format(const at::Tensor& input, const at::Tensor& weight) {
  bool last = input.dim() == 4 && (input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
                                   weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast);
  return last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// The outputs a CPU kernel's TensorIterator allocates for `inputs`: the
// broadcast shape, strides following the inputs' layout, one output per
// dtype in `dtypes`.
std::vector<at::Tensor> iterated(const std::vector<at::Tensor>& inputs, const std::vector<c10::ScalarType>& dtypes) {
  std::vector<at::Tensor> outs;
  at::TensorIteratorConfig config;
  config.check_all_same_dtype(false);
  for (auto dtype : dtypes) {
    outs.push_back(at::empty({0}, inputs.front().options().device(c10::kMeta).dtype(dtype)));
    config.add_output(outs.back());
  }
  for (const auto& t : inputs) config.add_const_input(t);
  config.build();
  return outs;
}

void push_outputs(torch::jit::Stack* stack, size_t first, const std::vector<at::Tensor>& outs) {
  stack->resize(first);
  for (const auto& t : outs) stack->emplace_back(t);
}
}  // namespace

bool segtune_shim::meta_by_rule(const std::string& name, torch::jit::Stack* stack, size_t first) {
  // Every op passes here: one lookup instead of a comparison per rule.
  // (A test in src/trial/mod.rs checks every name the rules compare with is here.)
  static const std::unordered_set<std::string> kRuled = {
      "aten::_adaptive_avg_pool2d",
      "aten::_adaptive_avg_pool2d_backward",
      "aten::_amp_foreach_non_finite_check_and_unscale_",
      "aten::_prelu_kernel",
      "aten::_prelu_kernel_backward",
      "aten::abs",
      "aten::binary_cross_entropy_with_logits",
      "aten::col2im",
      "aten::convolution",
      "aten::convolution_backward",
      "aten::flip",
      "aten::floor_divide",
      "aten::grid_sampler_2d",
      "aten::grid_sampler_2d_backward",
      "aten::hardswish_backward",
      "aten::hardtanh_backward",
      "aten::histc",
      "aten::im2col",
      "aten::index",
      "aten::logical_and",
      "aten::logical_and_",
      "aten::logical_or",
      "aten::logical_or_",
      "aten::max",
      "aten::min",
      "aten::native_batch_norm",
      "aten::native_batch_norm_backward",
      "aten::native_group_norm",
      "aten::native_group_norm_backward",
      "aten::native_layer_norm",
      "aten::native_layer_norm_backward",
      "aten::nll_loss2d_backward",
      "aten::nll_loss2d_forward",
      "aten::nonzero",
      "aten::relu",
      "aten::roll",
      "aten::where"};
  if (!kRuled.count(name)) return false;
  auto arg = [&](size_t i) -> c10::IValue& { return (*stack)[first + i]; };
  if (name == "aten::convolution") {
    at::Tensor input = arg(0).toTensor(), weight = arg(1).toTensor();
    auto stride = arg(3).toIntVector(), padding = arg(4).toIntVector(), dilation = arg(5).toIntVector();
    bool transposed = arg(6).toBool();
    auto output_padding = arg(7).toIntVector();
    int64_t groups = arg(8).toInt();
    int64_t dims = input.dim() - 2;
    std::vector<int64_t> sizes{input.size(0), transposed ? weight.size(1) * groups : weight.size(0)};
    for (int64_t d = 0; d < dims; ++d) {
      int64_t in = input.size(d + 2), k = weight.size(d + 2);
      int64_t s = stride[stride.size() == 1 ? 0 : d], p = padding[padding.size() == 1 ? 0 : d];
      int64_t dl = dilation[dilation.size() == 1 ? 0 : d];
      sizes.push_back(transposed ? (in - 1) * s - 2 * p + dl * (k - 1) + output_padding[output_padding.size() == 1 ? 0 : d] + 1
                                 : (in + 2 * p - dl * (k - 1) - 1) / s + 1);
    }
    push_outputs(stack, first, {at::empty(sizes, input.options().device(c10::kMeta).memory_format(conv_format(input, weight)))});
    return true;
  }
  if (name == "aten::convolution_backward") {
    at::Tensor input = arg(1).toTensor(), weight = arg(2).toTensor();
    auto bias_sizes = arg(3).isNone() ? std::vector<int64_t>{} : arg(3).toIntVector();
    auto mask = arg(10).to<std::array<bool, 3>>();
    at::Tensor gi, gw, gb;
    auto format = conv_format(input, weight);
    if (mask[0]) gi = meta_empty_like(input, format);
    if (mask[1]) gw = meta_empty_like(weight, format);
    if (mask[2]) gb = meta_empty({weight.size(arg(7).toBool() ? 1 : 0) * (arg(7).toBool() ? arg(9).toInt() : 1)}, weight, weight.scalar_type());
    push_outputs(stack, first, {gi, gw, gb});
    return true;
  }
  if (name == "aten::native_layer_norm") {
    at::Tensor input = arg(0).toTensor();
    auto normalized = arg(1).toIntVector();
    int64_t axis = input.dim() - static_cast<int64_t>(normalized.size());
    std::vector<int64_t> stat(input.sizes().begin(), input.sizes().begin() + axis);
    stat.resize(input.dim(), 1);
    auto dtype = stats_dtype(input, arg(2));
    push_outputs(stack, first, {meta_empty_like(input, at::MemoryFormat::Contiguous), meta_empty(stat, input, dtype),
                                meta_empty(stat, input, dtype)});
    return true;
  }
  if (name == "aten::native_layer_norm_backward") {
    at::Tensor input = arg(1).toTensor();
    auto mask = arg(7).to<std::array<bool, 3>>();
    at::Tensor gi, gw, gb;
    if (mask[0]) gi = meta_empty_like(input, at::MemoryFormat::Contiguous);
    if (mask[1] && arg(5).isTensor()) gw = meta_empty_like(arg(5).toTensor(), at::MemoryFormat::Contiguous);
    if (mask[2] && arg(6).isTensor()) gb = meta_empty_like(arg(6).toTensor(), at::MemoryFormat::Contiguous);
    push_outputs(stack, first, {gi, gw, gb});
    return true;
  }
  if (name == "aten::native_batch_norm") {
    at::Tensor input = arg(0).toTensor();
    bool training = arg(5).toBool();
    auto dtype = stats_dtype(input, arg(1));
    int64_t channels = training ? input.size(1) : 0;
    push_outputs(stack, first, {meta_empty_like(input, input.suggest_memory_format()), meta_empty({channels}, input, dtype),
                                meta_empty({channels}, input, dtype)});
    return true;
  }
  if (name == "aten::native_batch_norm_backward") {
    at::Tensor input = arg(1).toTensor();
    auto mask = arg(9).to<std::array<bool, 3>>();
    at::Tensor weight = arg(2).isTensor() ? arg(2).toTensor() : at::Tensor();
    auto param_dtype = weight.defined() ? weight.scalar_type() : input.scalar_type();
    at::Tensor gi, gw, gb;
    if (mask[0]) gi = meta_empty_like(input, input.suggest_memory_format());
    if (mask[1]) gw = meta_empty({input.size(1)}, input, param_dtype);
    if (mask[2]) gb = meta_empty({input.size(1)}, input, param_dtype);
    push_outputs(stack, first, {gi, gw, gb});
    return true;
  }
  if (name == "aten::native_group_norm") {
    // native_group_norm (group_norm.cpp): Y like X in X's suggested format,
    // mean and rstd [N, group] in the parameters' type when mixed.
    at::Tensor input = arg(0).toTensor();
    int64_t n = arg(3).toInt(), group = arg(6).toInt();
    auto dtype = stats_dtype(input, arg(1));
    push_outputs(stack, first, {meta_empty_like(input, input.suggest_memory_format()), meta_empty({n, group}, input, dtype),
                                meta_empty({n, group}, input, dtype)});
    return true;
  }
  if (name == "aten::native_group_norm_backward") {
    at::Tensor input = arg(1).toTensor();
    auto mask = arg(9).to<std::array<bool, 3>>();
    at::Tensor gi, gw, gb;
    if (mask[0]) gi = meta_empty_like(input, input.suggest_memory_format());
    if (mask[1] && arg(4).isTensor()) gw = meta_empty_like(arg(4).toTensor(), at::MemoryFormat::Contiguous);
    if (mask[2] && arg(4).isTensor()) gb = meta_empty_like(arg(4).toTensor(), at::MemoryFormat::Contiguous);
    push_outputs(stack, first, {gi, gw, gb});
    return true;
  }
  if (name == "aten::grid_sampler_2d") {
    // [N, C, H_grid, W_grid] in the input's type (GridSampler.cpp/.cu).
    at::Tensor input = arg(0).toTensor(), grid = arg(1).toTensor();
    push_outputs(stack, first, {meta_empty({input.size(0), input.size(1), grid.size(1), grid.size(2)}, input, input.scalar_type())});
    return true;
  }
  if (name == "aten::grid_sampler_2d_backward") {
    // grad_input zero-filled when the input needs it; grad_grid always.
    at::Tensor input = arg(1).toTensor(), grid = arg(2).toTensor();
    auto mask = arg(6).to<std::array<bool, 2>>();
    at::Tensor gi;
    if (mask[0]) gi = meta_empty_like(input, at::MemoryFormat::Contiguous);
    push_outputs(stack, first, {gi, meta_empty_like(grid, at::MemoryFormat::Contiguous)});
    return true;
  }
  if (name == "aten::_adaptive_avg_pool2d") {
    // AdaptiveAveragePooling.cpp (CPU) and .cu: [(N,) C, out_h, out_w] in
    // the input's type and suggested memory format.
    at::Tensor input = arg(0).toTensor();
    auto out = arg(1).toIntVector();
    std::vector<int64_t> sizes(input.sizes().begin(), input.sizes().end() - 2);
    sizes.insert(sizes.end(), out.begin(), out.end());
    push_outputs(stack, first,
                 {at::empty(sizes, input.options().device(c10::kMeta).memory_format(input.suggest_memory_format()))});
    return true;
  }
  if (name == "aten::_adaptive_avg_pool2d_backward") {
    // grad_input resized as the input, in its suggested memory format.
    at::Tensor input = arg(1).toTensor();
    push_outputs(stack, first, {meta_empty_like(input, input.suggest_memory_format())});
    return true;
  }
  if (name == "aten::abs") {
    at::Tensor self = arg(0).toTensor();
    push_outputs(stack, first, {meta_empty_like(self, self.suggest_memory_format())});
    return true;
  }
  // Data-dependent shapes, under the meta trace's stand-ins (shim.cpp's
  // run_on_cpu_zeros: masks all true, everything else zero): the shapes the
  // CPU kernel gives those stand-ins, without building the indices (a
  // boolean index over a batch's pixels costs a CPU pass over every pixel).
  if (name == "aten::nonzero" && stack->size() - first == 1) {
    at::Tensor self = arg(0).toTensor();
    int64_t found = self.scalar_type() == at::kBool ? self.numel() : 0;
    push_outputs(stack, first, {meta_empty({found, self.dim()}, self, at::kLong)});
    return true;
  }
  if (name == "aten::index" && stack->size() - first == 2 && arg(1).isList()) {
    // A mask indexes its dims by the positions it holds: every one for an
    // all-true (bool) stand-in, none for a zero (uint8) one.
    at::Tensor self = arg(0).toTensor();
    c10::List<std::optional<at::Tensor>> positions;
    bool masked = false;
    for (const c10::IValue& item : arg(1).toListRef()) {
      if (!item.isTensor()) {
        positions.push_back(std::nullopt);
        continue;
      }
      at::Tensor index = item.toTensor();
      if (index.scalar_type() != at::kBool && index.scalar_type() != at::kByte) {
        positions.push_back(index);
        continue;
      }
      masked = true;
      int64_t held = index.scalar_type() == at::kBool ? index.numel() : 0;
      for (int64_t d = 0; d < index.dim(); ++d) positions.push_back(meta_empty({held}, index, at::kLong));
    }
    if (!masked) return false;
    push_outputs(stack, first, {at::index(self, positions)});
    return true;
  }
  if (name == "aten::where" && stack->size() - first == 3 && arg(0).isTensor() && arg(1).isTensor() &&
      arg(2).isTensor()) {
    // where.self: the condition and both values cast to their common type.
    at::Tensor self = arg(1).toTensor(), other = arg(2).toTensor();
    auto dtype = at::result_type(self, other);
    at::Tensor condition = arg(0).toTensor();
    push_outputs(stack, first,
                 iterated({condition.scalar_type() == at::kByte ? condition.to(at::kBool) : condition,
                           self.to(dtype), other.to(dtype)},
                          {dtype}));
    return true;
  }
  if (name == "aten::floor_divide" && stack->size() - first == 2 && arg(0).isTensor() && arg(1).isScalar()) {
    // floor_divide.Scalar: elementwise, in the promoted type.
    at::Tensor self = arg(0).toTensor();
    auto dtype = at::result_type(self, arg(1).toScalar());
    push_outputs(stack, first, {at::empty_like(self, self.options().device(c10::kMeta).dtype(dtype))});
    return true;
  }
  // Elementwise ops whose meta functions live in Python: their CPU
  // kernels' TensorIterator outputs.
  auto tensor = [&](size_t i) { return arg(i).toTensor(); };
  if (name == "aten::relu" && stack->size() - first == 1) {
    push_outputs(stack, first, iterated({tensor(0)}, {tensor(0).scalar_type()}));
    return true;
  }
  if ((name == "aten::hardtanh_backward" && stack->size() - first == 4) ||
      (name == "aten::hardswish_backward" && stack->size() - first == 2)) {
    // (grad_output, self, ...): a binary op in their common type.
    auto dtype = at::result_type(tensor(0), tensor(1));
    push_outputs(stack, first, iterated({tensor(0), tensor(1)}, {dtype}));
    return true;
  }
  if (name == "aten::_prelu_kernel" && stack->size() - first == 2) {
    push_outputs(stack, first, iterated({tensor(0), tensor(1)}, {at::result_type(tensor(0), tensor(1))}));
    return true;
  }
  if (name == "aten::_prelu_kernel_backward" && stack->size() - first == 3) {
    // (grad, self, weight): grad_self and grad_weight, both broadcast over
    // self (autograd sums grad_weight down afterwards).
    at::Tensor grad = tensor(0), self = tensor(1), weight = tensor(2);
    push_outputs(stack, first, iterated({self, weight, grad}, {self.scalar_type(), weight.scalar_type()}));
    return true;
  }
  if ((name == "aten::logical_and" || name == "aten::logical_or") && stack->size() - first == 2) {
    push_outputs(stack, first, iterated({tensor(0), tensor(1)}, {at::kBool}));
    return true;
  }
  if ((name == "aten::logical_and_" || name == "aten::logical_or_") && stack->size() - first == 2) {
    push_outputs(stack, first, {tensor(0)});
    return true;
  }
  if (name == "aten::binary_cross_entropy_with_logits" && stack->size() - first == 5) {
    // Loss.cpp: (1 - target) * input - log_sigmoid(input), in the target's
    // shape and type, then reduced (none: 0, mean: 1, sum: 2).
    at::Tensor target = tensor(1);
    auto loss = iterated({target}, {target.scalar_type()});
    if (arg(4).toInt() != 0) loss = {meta_empty({}, target, target.scalar_type())};
    push_outputs(stack, first, loss);
    return true;
  }
  if (name == "aten::histc" && stack->size() - first == 4) {
    push_outputs(stack, first, {meta_empty({arg(1).toInt()}, tensor(0), tensor(0).scalar_type())});
    return true;
  }
  if (name == "aten::flip" && stack->size() - first == 2) {
    push_outputs(stack, first, {at::empty_like(tensor(0), at::MemoryFormat::Preserve)});
    return true;
  }
  if ((name == "aten::max" || name == "aten::min") && stack->size() - first == 1) {
    push_outputs(stack, first, {meta_empty({}, tensor(0), tensor(0).scalar_type())});
    return true;
  }
  if (name == "aten::roll" && stack->size() - first == 3) {
    push_outputs(stack, first, {meta_empty(tensor(0).sizes(), tensor(0), tensor(0).scalar_type())});
    return true;
  }
  if (name == "aten::im2col" && stack->size() - first == 5) {
    // Im2Col.cpp: [(N,) C kh kw, L], L the sliding positions.
    at::Tensor self = tensor(0);
    auto k = arg(1).toIntVector(), d = arg(2).toIntVector(), p = arg(3).toIntVector(), st = arg(4).toIntVector();
    int64_t h = self.size(-2), w = self.size(-1), c = self.size(-3);
    int64_t oh = (h + 2 * p[0] - (d[0] * (k[0] - 1) + 1)) / st[0] + 1;
    int64_t ow = (w + 2 * p[1] - (d[1] * (k[1] - 1) + 1)) / st[1] + 1;
    std::vector<int64_t> sizes{c * k[0] * k[1], oh * ow};
    if (self.dim() == 4) sizes.insert(sizes.begin(), self.size(0));
    push_outputs(stack, first, {meta_empty(sizes, self, self.scalar_type())});
    return true;
  }
  if (name == "aten::col2im" && stack->size() - first == 6) {
    // Col2Im.cpp: [(N,) C, out_h, out_w], C the columns over kh kw.
    at::Tensor self = tensor(0);
    auto out = arg(1).toIntVector(), k = arg(2).toIntVector();
    std::vector<int64_t> sizes{self.size(-2) / (k[0] * k[1]), out[0], out[1]};
    if (self.dim() == 3) sizes.insert(sizes.begin(), self.size(0));
    push_outputs(stack, first, {meta_empty(sizes, self, self.scalar_type())});
    return true;
  }
  if (name == "aten::_amp_foreach_non_finite_check_and_unscale_" && stack->size() - first == 3) {
    // GradScaler's unscale: in place on the gradients and found_inf,
    // nothing returned.
    stack->resize(first);
    return true;
  }
  if (name == "aten::nll_loss2d_forward") {
    at::Tensor self = arg(0).toTensor();
    int64_t reduction = arg(3).toInt();
    at::Tensor out = reduction == 0 ? meta_empty({self.size(0), self.size(2), self.size(3)}, self, self.scalar_type())
                                    : meta_empty({}, self, self.scalar_type());
    push_outputs(stack, first, {out, meta_empty({}, self, self.scalar_type())});
    return true;
  }
  if (name == "aten::nll_loss2d_backward") {
    at::Tensor self = arg(1).toTensor();
    push_outputs(stack, first, {meta_empty_like(self, at::MemoryFormat::Contiguous)});
    return true;
  }
  return false;
}

