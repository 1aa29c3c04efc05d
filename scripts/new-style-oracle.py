"""What mmengine 0.10.7 resolves segtune's new-style test configs to.

Run in the oracle venv of ../shared/oracle/README.md (mmengine 0.10.7,
mmsegmentation 1.2.2, mmdet 3.3.0 installed):

    ~/.cache/segtune/oracle-venv/bin/python scripts/new-style-oracle.py \
        > tests/fixtures/new_style_resolved.json

For each config under tests/fixtures/new_style/ (not `_base_`) it prints
`Config.fromfile(path).to_dict()` with every lazily imported class written
as the name MMSeg's registries find it by: the class is built (imported),
looked up in the registries of mmengine, MMSeg and MMDetection, and the
name kept is one that MMSeg's registry of the same kind resolves to that
very class (`scope.Name` for another codebase's scope).
"""
import json
import pathlib
import sys

import importlib.util
import os

from mmengine.config import Config
from mmengine.config.lazy import LazyAttr, LazyObject
import mmengine.registry as engine_registry

# mmcv-lite has no compiled ops: the oracle's stand-in `mmcv._ext` lets
# `mmcv.ops` (imported by mmseg.utils and mmdet) import.
ORACLE = os.environ.get('SEGTUNE_ORACLE_SCRIPT') or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), '..', '..', 'shared', 'oracle',
    'mmseg_cpu_oracle.py')
spec = importlib.util.spec_from_file_location('mmseg_cpu_oracle', ORACLE)
oracle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(oracle)
oracle.install_mmcv_ext_stub()

from mmseg.utils import register_all_modules  # noqa: E402

register_all_modules(init_default_scope=False)
import mmdet.utils  # noqa: E402

mmdet.utils.register_all_modules(init_default_scope=False)
import mmdet.registry as det_registry  # noqa: E402
import mmseg.registry as seg_registry  # noqa: E402
from mmengine.registry import Registry  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent / 'tests/fixtures/new_style'


def registries(module):
    return {k: v for k, v in vars(module).items() if isinstance(v, Registry)}


SEG = registries(seg_registry)
ALL = [registries(engine_registry), SEG, registries(det_registry)]


def registered_name(obj):
    cls = obj.build()
    candidates = []
    for regs in ALL:
        for kind, reg in regs.items():
            for name, value in reg.module_dict.items():
                if value is cls:
                    candidates.append((kind, name))
                    candidates.append((kind, f'{reg.scope}.{name}'))
    good = {n for kind, n in candidates if kind in SEG and SEG[kind].get(n) is cls}
    if not good:
        sys.exit(f'{obj}: no name that MMSeg registries resolve to {cls} ({candidates})')
    # The plainest name that works: the class name, another plain name, then scope.name.
    return sorted(good, key=lambda n: (n != cls.__name__, '.' in n, n))[0]


def convert(v):
    if isinstance(v, (LazyObject, LazyAttr)):
        return registered_name(v)
    if isinstance(v, dict):
        return {k: convert(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return {'__tuple__': [convert(x) for x in v]}
    if isinstance(v, list):
        return [convert(x) for x in v]
    return v


out = {}
for path in sorted(ROOT.rglob('*.py')):
    if '_base_' in path.parts:
        continue
    cfg = Config.fromfile(str(path))
    lazy = cfg._to_lazy_dict()
    out[str(path.relative_to(ROOT))] = convert(lazy)
json.dump({'command': 'scripts/new-style-oracle.py (oracle venv: mmengine 0.10.7, mmsegmentation 1.2.2, mmdet 3.3.0)',
           'configs': out}, sys.stdout, indent=1, sort_keys=True)
print()
