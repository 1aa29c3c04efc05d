#!/usr/bin/env python3
"""The CPU oracle for inference: MMSeg 1.2.2's real test step on the CPU.

Extends ../shared/oracle/mmseg_cpu_oracle.py (imported, not copied: its
counting allocator, its mmcv-lite stub, its offline config preparation) from
`model.train_step` to what MMEngine's TestLoop.run_iter does: under
torch.no_grad() (and autocast for bf16), `model.test_step(data)` with the
data preprocessor's test path and `predict` under `model.test_cfg`; the
predictions are kept until the step ends, as the evaluator reads them.

Per (config, batch, HxW image, test mode, precision): the peak bytes of
CPU tensors during each step, relative to the count before the model was
built (so parameters and the batch are in it), as the training oracle
reports `peak_bytes`.

Run it in the oracle's venv (../shared/oracle/README.md):
  VENV/bin/python scripts/oracle-infer.py --config CONFIG.py \
      --cases 1x512x1024:whole,1x512x1024:slide --precisions fp32,bf16 \
      --out tests/fixtures/oracle_cpu_infer.json
"""
import argparse
import gc
import importlib.util
import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def load_oracle(path):
    spec = importlib.util.spec_from_file_location('mmseg_cpu_oracle', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_test_batch(batch, h, w, num_classes, gen):
    """The batch a test dataloader hands to model.test_step()."""
    import torch
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    inputs, samples = [], []
    for _ in range(batch):
        img = torch.randint(0, 256, (3, h, w), generator=gen).float()
        seg = torch.randint(0, num_classes, (1, h, w), generator=gen, dtype=torch.int64)
        ds = SegDataSample()
        ds.gt_sem_seg = PixelData(data=seg)
        ds.set_metainfo(dict(img_path='random.png', seg_map_path='random.png',
                             ori_shape=(h, w), img_shape=(h, w),
                             scale_factor=(1.0, 1.0), flip=False,
                             flip_direction=None, reduce_zero_label=False))
        inputs.append(img)
        samples.append(ds)
    return dict(inputs=inputs, data_samples=samples)


def run_case(oracle, alloc, path, batch, h, w, mode, precision, steps, seed):
    import torch
    from mmseg.registry import MODELS
    gc.collect()
    base = alloc.current_bytes()
    torch.manual_seed(seed)
    cfg, _ = oracle.prepare_cfg(path, max(h, w))
    cfg.model.data_preprocessor.size = None
    if mode == 'whole':
        # As `--cfg-options model.test_cfg.mode=whole` would: the other keys
        # stay (PointRend's subdivision settings; a slide config's crop_size
        # and stride, which whole inference does not read).
        cfg.model.test_cfg = dict(cfg.model.get('test_cfg', {}), mode='whole')
    elif cfg.model.get('test_cfg', {}).get('mode') != 'slide':
        raise SystemExit(f'{path}: its test_cfg is not slide')
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.eval()
    ncls = oracle.num_classes_of(cfg)
    gen = torch.Generator().manual_seed(seed)
    rec = dict(config=os.path.basename(path)[:-3], batch=batch, image=[h, w],
               mode=mode, precision=precision, test_cfg=dict(cfg.model.test_cfg),
               per_step=[])
    for step in range(steps):
        data = make_test_batch(batch, h, w, ncls, gen)
        alloc.reset_peak()
        t0 = time.perf_counter()
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16,
                                             enabled=precision == 'bf16'):
            outputs = model.test_step(data)
        peak = alloc.peak_bytes() - base
        seconds = time.perf_counter() - t0
        del outputs, data
        gc.collect()
        rec['per_step'].append(dict(peak_bytes=peak, time_s=round(seconds, 3)))
    rec['peak_steps2_3_bytes'] = max(s['peak_bytes'] for s in rec['per_step'][1:])
    del model
    gc.collect()
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--config', required=True)
    p.add_argument('--cases', required=True,
                   help='BxHxW:MODE,... (MODE whole or slide: the config\'s slide test_cfg)')
    p.add_argument('--precisions', default='fp32')
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--oracle', default=os.path.join(HERE, '..', '..', 'shared', 'oracle',
                                                    'mmseg_cpu_oracle.py'))
    p.add_argument('--ext-dir', default=None)
    p.add_argument('--out', required=True)
    args = p.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    oracle = load_oracle(args.oracle)
    alloc = oracle.load_counting_allocator(args.ext_dir)
    oracle.install_mmcv_ext_stub()
    warnings.filterwarnings('ignore')
    import mmcv.ops  # noqa: F401
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    from mmengine.logging import MMLogger
    MMLogger.get_instance('mmengine', log_level='ERROR')
    records = []
    for precision in args.precisions.split(','):
        for case in args.cases.split(','):
            shape, mode = case.split(':')
            b, h, w = (int(x) for x in shape.split('x'))
            print(f'{os.path.basename(args.config)} {precision} {shape} {mode}', flush=True)
            rec = run_case(oracle, alloc, args.config, b, h, w, mode, precision,
                           args.steps, args.seed)
            print(f'  peak {rec["peak_steps2_3_bytes"]}', flush=True)
            records.append(rec)
    with open(args.out, 'w') as f:
        json.dump(dict(command=' '.join(sys.argv), torch=torch.__version__,
                       records=records), f, indent=1)


if __name__ == '__main__':
    main()
