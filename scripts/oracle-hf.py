#!/usr/bin/env python3
"""The CPU oracle for Hugging Face SegFormer fine-tuning: transformers'
`SegformerForSemanticSegmentation` trained by `Trainer`'s own step on the
CPU, under the counting allocator of ../shared/oracle/mmseg_cpu_oracle.py
(imported, not copied).

One step is what `Trainer._inner_training_loop` runs per optimizer update
with one micro-batch (transformers 5.x, trainer.py): `training_step(model,
inputs)` (the real method: `compute_loss` under the loss context, `del
inputs`, the loss divided for accumulation, `accelerator.backward`), then
`_clip_grad_norm(model)` (accelerate's `clip_grad_norm_`, max_grad_norm
1.0), `optimizer.step()` (the optimizer `Trainer.create_optimizer` builds:
AdamW with `fused=True` by default) and `model.zero_grad()`. The batch is
one `pixel_values` float tensor `[B, 3, H, W]` and one `labels` tensor
`[B, H, W]`, as the default data collator stacks them; the data loader
itself (accelerate prefetches one batch ahead) is left out, as it is on the
GPU side of a real run.

Per (model dir, batch, size): the peak bytes of CPU tensors during each
step, relative to the count before the model was built (parameters and the
batch are in it), as the MMSeg oracle reports `peak_bytes`.

Run it in the oracle's venv (../shared/oracle/README.md) with
`pip install transformers accelerate`:
  VENV/bin/python scripts/oracle-hf.py --variant b0 --cases 2x512,2x1024 \
      --out tests/fixtures/oracle_cpu_hf.json
"""
import argparse
import gc
import importlib.util
import json
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ARCH = {
    'b0': dict(hidden_sizes=[32, 64, 160, 256], depths=[2, 2, 2, 2], decoder_hidden_size=256),
    'b1': dict(hidden_sizes=[64, 128, 320, 512], depths=[2, 2, 2, 2], decoder_hidden_size=256),
    'b2': dict(hidden_sizes=[64, 128, 320, 512], depths=[3, 4, 6, 3], decoder_hidden_size=768),
}


def load_oracle(path):
    spec = importlib.util.spec_from_file_location('mmseg_cpu_oracle', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_case(alloc, variant, batch, size, steps, seed, checkpointing=False):
    import torch
    from transformers import (SegformerConfig, SegformerForSemanticSegmentation, Trainer,
                              TrainingArguments)

    rec = dict(variant=f'mit-{variant}', batch=batch, size=[size, size], precision='fp32',
               gradient_checkpointing=checkpointing, steps=steps, status='ok')
    gc.collect()
    base = alloc.current_bytes()
    rel = lambda: alloc.current_bytes() - base  # noqa: E731
    torch.manual_seed(seed)
    config = SegformerConfig(num_labels=150, num_attention_heads=[1, 2, 5, 8], **ARCH[variant])
    model = SegformerForSemanticSegmentation(config)
    rec['attn_implementation'] = model.config._attn_implementation
    rec['params'] = sum(p.numel() for p in model.parameters())
    rec['bytes_after_model_build'] = rel()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=batch,
                                 gradient_checkpointing=checkpointing,
                                 use_cpu=True, report_to=[], save_strategy='no',
                                 logging_strategy='no', disable_tqdm=True)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            trainer = Trainer(model=model, args=args)
        if checkpointing:
            # what Trainer.train does before the loop under gradient_checkpointing
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs)
        trainer.create_optimizer_and_scheduler(num_training_steps=steps)
        rec['optimizer'] = type(trainer.optimizer).__name__
        rec['optim'] = str(args.optim)
        rec['optimizer_defaults'] = {k: v for k, v in trainer.optimizer.defaults.items()
                                     if isinstance(v, (bool, int, float))}
        # what _inner_training_loop sets per update: one micro-batch here
        trainer.current_gradient_accumulation_steps = 1
        model.train()
        gen = torch.Generator().manual_seed(seed + 1)
        per_step = []
        for i in range(steps):
            inputs = dict(
                pixel_values=torch.randn(batch, 3, size, size, generator=gen),
                labels=torch.randint(0, 150, (batch, size, size), generator=gen),
            )
            if i == 0:
                rec['batch_bytes'] = sum(t.numel() * t.element_size() for t in inputs.values())
            before = rel()
            alloc.reset_peak()
            t = time.perf_counter()
            loss = trainer.training_step(model, inputs)
            del inputs
            backward_peak = alloc.peak_bytes() - base
            alloc.reset_peak()
            trainer._clip_grad_norm(model)
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
            model.zero_grad()
            optimizer_peak = alloc.peak_bytes() - base
            dt = time.perf_counter() - t
            per_step.append(dict(step=i + 1, time_s=round(dt, 3), bytes_before=before,
                                 peak_bytes=max(backward_peak, optimizer_peak),
                                 forward_backward_peak=backward_peak,
                                 optimizer_peak=optimizer_peak, bytes_after=rel(),
                                 loss=float(loss)))
        rec['per_step'] = per_step
        rec['peak_steps2_3_bytes'] = max(s['peak_bytes'] for s in per_step[1:])
        del trainer, model
    return rec


def versions():
    import torch
    import transformers
    import accelerate
    return dict(torch=torch.__version__, transformers=transformers.__version__,
                accelerate=accelerate.__version__, python=sys.version.split()[0],
                threads=torch.get_num_threads())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--variant', default='b0', choices=sorted(ARCH))
    ap.add_argument('--cases', default='2x512,2x1024', help='BATCHxSIZE,...')
    ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--gradient-checkpointing', action='store_true')
    ap.add_argument('--seed', type=int, default=0)
    ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--oracle', default=os.path.join(HERE, '..', '..', 'shared', 'oracle',
                                                     'mmseg_cpu_oracle.py'))
    ap.add_argument('--ext-dir', default=None, help='build dir of the counting allocator')
    ap.add_argument('--out', required=True)
    args = ap.parse_args()
    oracle = load_oracle(args.oracle)
    alloc = oracle.load_counting_allocator(args.ext_dir)
    import torch
    torch.set_num_threads(args.threads)
    records = []
    for case in args.cases.split(','):
        batch, size = (int(x) for x in case.split('x'))
        rec = run_case(alloc, args.variant, batch, size, args.steps, args.seed,
                       args.gradient_checkpointing)
        print(f'mit-{args.variant} {batch}x{size}: peak23={rec["peak_steps2_3_bytes"]}',
              file=sys.stderr)
        records.append(rec)
    out = dict(command=' '.join(['scripts/oracle-hf.py'] + sys.argv[1:]), versions=versions(),
               records=records)
    with open(args.out, 'w') as f:
        json.dump(out, f, indent=1)


if __name__ == '__main__':
    main()
