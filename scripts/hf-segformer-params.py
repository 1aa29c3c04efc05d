#!/usr/bin/env python3
"""Parameter counts of Hugging Face SegformerForSemanticSegmentation mit-b0..b5
(150 labels), built from a config with no weights, as `transformers` counts
them: the fixture tests/fixtures/hf_segformer_params.json.

  VENV/bin/python scripts/hf-segformer-params.py > tests/fixtures/hf_segformer_params.json

VENV: the oracle venv (../shared/oracle/README.md) plus `pip install transformers accelerate`.
"""
import json

import torch
import transformers
from transformers import SegformerConfig, SegformerForSemanticSegmentation

# The published mit-b0..b5 architectures (nvidia/mit-b* config.json).
VARIANTS = {
    'b0': dict(hidden_sizes=[32, 64, 160, 256], depths=[2, 2, 2, 2], decoder_hidden_size=256),
    'b1': dict(hidden_sizes=[64, 128, 320, 512], depths=[2, 2, 2, 2], decoder_hidden_size=256),
    'b2': dict(hidden_sizes=[64, 128, 320, 512], depths=[3, 4, 6, 3], decoder_hidden_size=768),
    'b3': dict(hidden_sizes=[64, 128, 320, 512], depths=[3, 4, 18, 3], decoder_hidden_size=768),
    'b4': dict(hidden_sizes=[64, 128, 320, 512], depths=[3, 8, 27, 3], decoder_hidden_size=768),
    'b5': dict(hidden_sizes=[64, 128, 320, 512], depths=[3, 6, 40, 3], decoder_hidden_size=768),
}


def main():
    out = dict(transformers=transformers.__version__, torch=torch.__version__, models={})
    for name, arch in VARIANTS.items():
        cfg = SegformerConfig(num_labels=150, num_attention_heads=[1, 2, 5, 8], **arch)
        model = SegformerForSemanticSegmentation(cfg)
        params = list(model.named_parameters())
        by_prefix = {}
        for n, p in params:
            top = n.split('.')[0]
            by_prefix[top] = by_prefix.get(top, 0) + p.numel()
        out['models'][f'mit-{name}'] = dict(
            config=dict(num_labels=150, **arch),
            total=sum(p.numel() for _, p in params),
            trainable=sum(p.numel() for _, p in params if p.requires_grad),
            by_prefix=by_prefix,
            buffers=sum(b.numel() for b in model.buffers()),
            names=[n for n, _ in params],
        )
    print(json.dumps(out, indent=1))


if __name__ == '__main__':
    main()
