// mmcv's PSAMask (mmcv/ops/psa_mask.py with its psamask_forward/backward
// kernels, mmcv/ops/csrc/pytorch/cpu/psamask.cpp) as a custom autograd
// function: the forward saves its input and fills a new zero tensor
// [N, H*W, H, W]; the backward fills a new zero gradient of the input's
// shape. The same tensors as mmcv's op, with the kernels' loops run on the
// CPU (a CUDA tensor is filled through a CPU copy; on a shape-only trace the
// tensors are only allocated, as an op-level trace needs).
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "segtune_ffi.h"
#include "shim.h"

using segtune_shim::guarded;

namespace {

struct MaskGeometry {
  int64_t num, h_feature, w_feature, h_mask, w_mask, half_h_mask, half_w_mask;
  bool collect;
};

MaskGeometry geometry(const at::Tensor& mask_shaped, int64_t h_mask, int64_t w_mask, bool collect) {
  return {mask_shaped.size(0), mask_shaped.size(2), mask_shaped.size(3), h_mask, w_mask,
          (h_mask - 1) / 2,   (w_mask - 1) / 2,     collect};
}

// Visits every (mask element, feature position) pair the kernels copy:
// `f(n, mask_channel, h, w, out_channel, out_h, out_w)`.
template <typename F>
void for_each_pair(const MaskGeometry& g, F f) {
  const int64_t hw = g.h_feature * g.w_feature;
  for (int64_t n = 0; n < g.num; ++n)
    for (int64_t h = 0; h < g.h_feature; ++h)
      for (int64_t w = 0; w < g.w_feature; ++w) {
        const int64_t hstart = std::max<int64_t>(0, g.half_h_mask - h);
        const int64_t hend = std::min<int64_t>(g.h_mask, g.h_feature + g.half_h_mask - h);
        const int64_t wstart = std::max<int64_t>(0, g.half_w_mask - w);
        const int64_t wend = std::min<int64_t>(g.w_mask, g.w_feature + g.half_w_mask - w);
        for (int64_t hidx = hstart; hidx < hend; ++hidx)
          for (int64_t widx = wstart; widx < wend; ++widx) {
            const int64_t th = hidx + h - g.half_h_mask, tw = widx + w - g.half_w_mask;
            const int64_t mask_channel = hidx * g.w_mask + widx;
            if (g.collect)
              f(n, mask_channel, h, w, th * g.w_feature + tw, h, w);
            else
              f(n, mask_channel, h, w, h * g.w_feature + w, th, tw);
          }
        (void)hw;
      }
}

// forward: out[n][oc][oh][ow] = in[n][mc][h][w]; backward: the reverse.
// `to` is a contiguous zero tensor of `from`'s dtype, both on the CPU.
void fill_cpu(const at::Tensor& from, const at::Tensor& to, const MaskGeometry& g, bool forward) {
  const int64_t hw = g.h_feature * g.w_feature;
  const int64_t mask_channels = g.h_mask * g.w_mask;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, from.scalar_type(), "psamask", [&] {
    const scalar_t* s = from.data_ptr<scalar_t>();
    scalar_t* d = to.data_ptr<scalar_t>();
    for_each_pair(g, [&](int64_t n, int64_t mc, int64_t h, int64_t w, int64_t oc, int64_t oh, int64_t ow) {
      const int64_t mask_at = ((n * mask_channels + mc) * g.h_feature + h) * g.w_feature + w;
      const int64_t out_at = ((n * hw + oc) * g.h_feature + oh) * g.w_feature + ow;
      if (forward)
        d[out_at] = s[mask_at];
      else
        d[mask_at] = s[out_at];
    });
  });
}

// On the CPU the kernel writes into `to` itself, as mmcv's CPU kernel does;
// a CUDA tensor is filled through host copies (no device memory beyond
// `to`); a meta tensor only has its shape.
void fill(const at::Tensor& from, const at::Tensor& to, const MaskGeometry& g, bool forward, bool values) {
  if (!values || from.is_meta()) return;
  at::NoGradGuard no_grad;
  if (from.device().is_cpu()) {
    fill_cpu(from.contiguous(), to, g, forward);
    return;
  }
  auto host_to = at::zeros(to.sizes(), to.options().device(at::kCPU));
  fill_cpu(from.cpu().contiguous(), host_to, g, forward);
  to.copy_(host_to);
}

struct PsaMaskFunction : public torch::autograd::Function<PsaMaskFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, bool collect,
                            int64_t h_mask, int64_t w_mask, bool values) {
    TORCH_CHECK(input.dim() == 4 && input.size(1) == h_mask * w_mask,
                "PSAMask: the input must be [N, h_mask * w_mask, H, W]");
    ctx->save_for_backward({input});
    ctx->saved_data["collect"] = collect;
    ctx->saved_data["h_mask"] = h_mask;
    ctx->saved_data["w_mask"] = w_mask;
    ctx->saved_data["values"] = values;
    const auto g = geometry(input, h_mask, w_mask, collect);
    auto output = input.new_zeros({g.num, g.h_feature * g.w_feature, g.h_feature, g.w_feature});
    fill(input, output, g, true, values);
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto input = ctx->get_saved_variables()[0];
    const auto g = geometry(input, ctx->saved_data["h_mask"].toInt(), ctx->saved_data["w_mask"].toInt(),
                            ctx->saved_data["collect"].toBool());
    auto grad_input = grads[0].new_zeros(input.sizes());
    fill(grads[0], grad_input, g, false, ctx->saved_data["values"].toBool());
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

// `values`: false on a shape-only (meta) trace, whose tensors have no data.
extern "C" at::Tensor* segtune_psamask(const at::Tensor* input, bool collect, int64_t h_mask, int64_t w_mask,
                                       bool values) {
  at::Tensor* out = nullptr;
  guarded([&] { out = new at::Tensor(PsaMaskFunction::apply(*input, collect, h_mask, w_mask, values)); });
  return out;
}
