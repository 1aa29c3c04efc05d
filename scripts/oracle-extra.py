#!/usr/bin/env python3
"""The shared CPU oracle (../shared/oracle/mmseg_cpu_oracle.py), unchanged,
with the things it lacks for K-Net, PSANet and PIDNet:

* `SEGTUNE_ORACLE_EDGE_WIDTH=4`: PIDNet's edge maps (`gt_edge_map`,
  made by MMSeg's GenerateEdge from each synthetic label), which the
  shared script's batch lacks.
* `num_classes_of`: K-Net's IterativeDecodeHead has no `num_classes` of its
  own; it is its kernel generate head's (as IterativeDecodeHead.__init__
  copies it). The oracle's synthetic labels need it.
* mmcv's compiled `psamask_forward` / `psamask_backward` (mmcv-lite ships
  neither; the oracle's stand-in `mmcv._ext` raises on them): written here
  with tensor views and `copy_` into the buffers mmcv's `PSAMaskFunction`
  allocates itself (`new_zeros`), index for index as mmcv's CPU kernel
  (mmcv/ops/csrc/pytorch/cpu/psamask.cpp: psamask_collect_forward and
  friends) writes them. Like that kernel they allocate nothing, so the
  step's memory is MMSeg's own: the tensors, what autograd saves
  (`ctx.save_for_backward(input)`) and when it is freed all come from
  mmseg and mmcv's Python, untouched.

Usage: the oracle's own arguments, e.g.

    /path/to/oracle-venv/bin/python scripts/oracle-extra.py \
        --config-root ../shared/mmseg-configs/configs \
        --only psanet_r50-d8_4xb2-40k_cityscapes-512x1024 \
        --grid 1x128,2x128 --precisions fp32,bf16 --out psa.json

`SEGTUNE_ORACLE_SCRIPT` names the oracle script if ../shared is elsewhere.
"""
import importlib.util
import os
import sys

HERE = os.path.abspath(__file__)
ORACLE = os.environ.get('SEGTUNE_ORACLE_SCRIPT') or os.path.join(
    os.path.dirname(HERE), '..', '..', 'shared', 'oracle', 'mmseg_cpu_oracle.py')


def load_oracle():
    if not os.path.exists(ORACLE):
        sys.exit(f'oracle-extra: no oracle script at {ORACLE} '
                 '(set SEGTUNE_ORACLE_SCRIPT)')
    spec = importlib.util.spec_from_file_location('mmseg_cpu_oracle', ORACLE)
    oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oracle)
    # Workers are started as `python <oracle.__file__> --worker ...`: make
    # them run this file, so that they get the same additions.
    oracle.__file__ = HERE
    return oracle


def windows(h, w, h_feature, w_feature, h_mask, w_mask, half_h, half_w):
    """The mask window of feature position (h, w) inside the map, in mask
    indices (hs:he, ws:we) and in feature indices (rows, cols)."""
    hs = max(0, half_h - h)
    he = min(h_mask, h_feature + half_h - h)
    ws = max(0, half_w - w)
    we = min(w_mask, w_feature + half_w - w)
    rows = slice(hs + h - half_h, he + h - half_h)
    cols = slice(ws + w - half_w, we + w - half_w)
    return slice(hs, he), slice(ws, we), rows, cols


def psamask(mask_like, buffer_like, psa_type, num_, h_feature, w_feature,
            h_mask, w_mask, half_h_mask, half_w_mask, backward):
    # 0 collect, 1 distribute (mmcv's PSAMask passes the type as an int).
    mask5 = mask_like.view(num_, h_mask, w_mask, h_feature, w_feature)
    buf5 = buffer_like.view(num_, h_feature, w_feature, h_feature, w_feature)
    for h in range(h_feature):
        for w in range(w_feature):
            mh, mw, rows, cols = windows(h, w, h_feature, w_feature, h_mask,
                                         w_mask, half_h_mask, half_w_mask)
            if psa_type == 0:
                buf = buf5[:, rows, cols, h, w]
            else:
                buf = buf5[:, h, w, rows, cols]
            mask = mask5[:, mh, mw, h, w]
            if backward:
                mask.copy_(buf)
            else:
                buf.copy_(mask)


def psamask_forward(input, output, *, psa_type, num_, h_feature, w_feature,
                    h_mask, w_mask, half_h_mask, half_w_mask):
    psamask(input, output, psa_type, num_, h_feature, w_feature, h_mask,
            w_mask, half_h_mask, half_w_mask, backward=False)


def psamask_backward(grad_output, grad_input, *, psa_type, num_, h_feature,
                     w_feature, h_mask, w_mask, half_h_mask, half_w_mask):
    psamask(grad_input, grad_output, psa_type, num_, h_feature, w_feature,
            h_mask, w_mask, half_h_mask, half_w_mask, backward=True)


def patch(oracle):
    install_stub = oracle.install_mmcv_ext_stub

    def install_mmcv_ext_stub():
        install_stub()
        ext = sys.modules['mmcv._ext']
        ext.psamask_forward = psamask_forward
        ext.psamask_backward = psamask_backward

    oracle.install_mmcv_ext_stub = install_mmcv_ext_stub

    num_classes_of = oracle.num_classes_of

    def num_classes_of_knet(cfg):
        dh = cfg.model.decode_head
        if not isinstance(dh, (list, tuple)) and dh.get('type') == 'IterativeDecodeHead':
            return int(dh.kernel_generate_head.num_classes)
        return num_classes_of(cfg)

    oracle.num_classes_of = num_classes_of_knet

    # PIDNet's PIDHead reads `gt_edge_map`, which MMSeg's pipeline makes
    # with GenerateEdge (its configs: edge_width=4) and PackSegInputs packs
    # as an int64 1xHxW tensor. SEGTUNE_ORACLE_EDGE_WIDTH=4 adds it to each
    # synthetic sample, from its label, with MMSeg's own transform.
    edge_width = int(os.environ.get('SEGTUNE_ORACLE_EDGE_WIDTH', '0'))
    if edge_width:
        make_batch = oracle.make_batch

        def make_batch_with_edges(batch, crop, num_classes, gen):
            import numpy as np
            import torch
            from mmengine.structures import PixelData
            from mmseg.datasets.transforms import GenerateEdge
            data, nbytes = make_batch(batch, crop, num_classes, gen)
            for ds in data['data_samples']:
                seg = ds.gt_sem_seg.data
                r = GenerateEdge(edge_width=edge_width).transform(
                    dict(img_shape=(crop, crop),
                         gt_seg_map=seg[0].numpy().astype(np.uint8)))
                ds.gt_edge_map = PixelData(data=torch.tensor(
                    r['gt_edge_map'][None].astype(np.int64)))
            return data, nbytes

        oracle.make_batch = make_batch_with_edges


def self_check():
    """The stand-in against mmcv's kernel formula, element by element, on a
    small map (run with --self-check)."""
    import torch
    n, hf, wf, hm, wm = 2, 5, 4, 5, 3
    half_h, half_w = (hm - 1) // 2, (wm - 1) // 2
    x = torch.randn(n, hm * wm, hf, wf)
    for psa_type in (0, 1):
        out = x.new_zeros(n, hf * wf, hf, wf)
        psamask_forward(x, out, psa_type=psa_type, num_=n, h_feature=hf,
                        w_feature=wf, h_mask=hm, w_mask=wm,
                        half_h_mask=half_h, half_w_mask=half_w)
        want = torch.zeros(n * hf * wf * hf * wf)
        flat = x.reshape(-1)
        for b in range(n):
            for h in range(hf):
                for w in range(wf):
                    for hidx in range(max(0, half_h - h), min(hm, hf + half_h - h)):
                        for widx in range(max(0, half_w - w), min(wm, wf + half_w - w)):
                            fh, fw = hidx + h - half_h, widx + w - half_w
                            if psa_type == 0:
                                at = (b * hf * wf + fh * wf + fw) * hf * wf + h * wf + w
                            else:
                                at = (b * hf * wf + h * wf + w) * hf * wf + fh * wf + fw
                            want[at] = flat[((b * hm * wm + hidx * wm + widx) * hf + h) * wf + w]
        assert torch.equal(out.reshape(-1), want), f'psa_type {psa_type} forward'
        grad_in = x.new_zeros(x.shape)
        psamask_backward(out, grad_in, psa_type=psa_type, num_=n, h_feature=hf,
                         w_feature=wf, h_mask=hm, w_mask=wm,
                         half_h_mask=half_h, half_w_mask=half_w)
        # Every in-window element goes there and back again.
        window = (want.reshape(out.shape) != 0)
        assert window.any()
        back = x.new_zeros(x.shape)
        psamask_backward(window.float(), back, psa_type=psa_type, num_=n,
                         h_feature=hf, w_feature=wf, h_mask=hm, w_mask=wm,
                         half_h_mask=half_h, half_w_mask=half_w)
        assert torch.equal(grad_in, x * back), f'psa_type {psa_type} backward'
    print('oracle-extra: psamask stand-in equals the mmcv kernel formula')


if __name__ == '__main__':
    if sys.argv[1:] == ['--self-check']:
        self_check()
        sys.exit(0)
    oracle = load_oracle()
    patch(oracle)
    oracle.main()
