"""segtune's Python worker: one training trial of an MMSeg config in the
user's own Python, with MMSeg's own modules and `model.train_step`.

segtune (src/worker/python_worker.rs) runs this file with the interpreter it
chose and `--request JSON`: the `TrialRequest` (src/trial/request.rs) every
worker reads, with `inspect` and `record_ops` beside it; it prints ONE JSON
object on stdout:

* a `TrialReport` (src/trial/report.rs) with `"worker": "python"`; exit 0
  when its status is `ok`, 1 otherwise (`oom`, `infeasible`, `error`,
  `non_finite_loss`);
* or, when the trial cannot start (no MMSeg in this Python, a config that
  does not load, no such device), `{"python_worker_error": {...}}` with a
  `kind` (`missing_mmseg`, `config`, `device`, `environment`); exit 2.

Measurement, as the MMSeg CPU oracle (`../shared/oracle/mmseg_cpu_oracle.py`)
measures it: on the CPU a counting allocator replaces libtorch's CPU
allocator before MMSeg is imported (every storage counted at its requested
size); bytes are relative to the count just before the model is built; each
step's peak is reset when the step starts; the trial's peak is the largest
over the measured steps. On CUDA: `reset_peak_memory_stats`,
`max_memory_allocated` and `max_memory_reserved` per step.
"""
import argparse
import copy
import gc
import importlib.machinery
import importlib.util
import json
import os
import sys
import time
import types
import warnings

PIP_LINE = 'pip install mmengine==0.10.7 mmcv-lite==2.1.0 mmsegmentation==1.2.2'
ONE_VALUE_PER_CHANNEL = 'Expected more than 1 value per channel'

# The counting CPU allocator: c10::SetCPUAllocator at priority 255 (above
# libtorch's default), a pointer -> requested-size map, live and peak bytes.
COUNTING_ALLOCATOR = r'''
#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <array>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace segtune_py {
std::mutex mu;
// pointer -> (requested bytes, allocation number)
std::unordered_map<void*, std::pair<size_t, int64_t>> live;
int64_t current_bytes = 0;
int64_t peak_bytes = 0;
int64_t next_id = 0;
// The trace: (id, bytes, phase code) per allocation (bytes > 0) and per
// free (bytes < 0) of an allocation made while tracing.
bool tracing = false;
int64_t first_traced_id = -1;
int64_t phase_code = 0;
std::vector<std::array<int64_t, 3>> events;

void release(void* ptr) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> guard(mu);
    auto found = live.find(ptr);
    if (found != live.end()) {
      int64_t bytes = static_cast<int64_t>(found->second.first);
      int64_t id = found->second.second;
      current_bytes -= bytes;
      if (tracing && first_traced_id >= 0 && id >= first_traced_id) {
        events.push_back({id, -bytes, phase_code});
      }
      live.erase(found);
    }
  }
  c10::free_cpu(ptr);
}

struct Counting final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    void* ptr = bytes == 0 ? nullptr : c10::alloc_cpu(bytes);
    if (ptr != nullptr) {
      std::lock_guard<std::mutex> guard(mu);
      int64_t id = next_id++;
      live.emplace(ptr, std::make_pair(bytes, id));
      current_bytes += static_cast<int64_t>(bytes);
      peak_bytes = std::max(peak_bytes, current_bytes);
      if (tracing) {
        events.push_back({id, static_cast<int64_t>(bytes), phase_code});
      }
    }
    // libtorch requires a CPU storage's context to be its data pointer.
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t n) const override {
    default_copy_data(dest, src, n);
  }
};

Counting allocator;
}  // namespace segtune_py

void install() { c10::SetCPUAllocator(&segtune_py::allocator, 255); }
int64_t current() { std::lock_guard<std::mutex> g(segtune_py::mu); return segtune_py::current_bytes; }
int64_t peak() { std::lock_guard<std::mutex> g(segtune_py::mu); return segtune_py::peak_bytes; }
void reset_peak() {
  std::lock_guard<std::mutex> g(segtune_py::mu);
  segtune_py::peak_bytes = segtune_py::current_bytes;
}
void start_trace() {
  std::lock_guard<std::mutex> g(segtune_py::mu);
  segtune_py::tracing = true;
  segtune_py::first_traced_id = segtune_py::next_id;
  segtune_py::events.clear();
}
void set_phase(int64_t code) {
  std::lock_guard<std::mutex> g(segtune_py::mu);
  segtune_py::phase_code = code;
}
// Stops tracing and writes segtune's trace text (v2: id bytes phase scope),
// ids renumbered from 0 in the order of allocation.
bool write_trace(std::string path) {
  std::vector<std::array<int64_t, 3>> events;
  int64_t first;
  {
    std::lock_guard<std::mutex> g(segtune_py::mu);
    segtune_py::tracing = false;
    events.swap(segtune_py::events);
    first = segtune_py::first_traced_id;
  }
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  std::fputs("# segtune trace v2: id bytes phase scope\n", f);
  for (const auto& e : events) {
    std::fprintf(f, "%lld %lld %lld 0\n", static_cast<long long>(e[0] - first),
                 static_cast<long long>(e[1]), static_cast<long long>(e[2]));
  }
  return std::fclose(f) == 0;
}
'''


class StartError(Exception):
    """The trial cannot start: printed as `python_worker_error`, exit 2."""

    def __init__(self, kind, message, **extra):
        super().__init__(message)
        self.kind = kind
        self.extra = extra


def emit(obj, code):
    sys.stdout.write(json.dumps(obj) + '\n')
    sys.stdout.flush()
    sys.exit(code)


def parse_args(argv):
    ap = argparse.ArgumentParser(prog='segtune-python-worker')
    ap.add_argument('--request', required=True,
                    help='a TrialRequest as JSON (src/trial/request.rs), '
                         'with "inspect" and "record_ops"')
    ap.add_argument('--ext-dir', default=None)
    given = ap.parse_args(argv)
    return request_args(json.loads(given.request), given.ext_dir)


def request_args(request, ext_dir=None):
    """The settings of a TrialRequest's JSON, by the names this file uses."""
    return argparse.Namespace(
        config=request['config'],
        cfg_options=list(request.get('cfg_options') or []),
        batch_size=int(request['batch_size']),
        crop=tuple(int(n) for n in request['crop']),
        amp=request['amp'],
        accum=request.get('accumulative_counts'),
        warmup=int(request['warmup_steps']),
        steps=int(request['measured_steps']),
        threads=request.get('threads'),
        device=request['device'],
        seed=int(request['seed']),
        ignore_fraction=float(request['ignore_fraction']),
        gt_segments=request.get('gt_segments'),
        ext_dir=ext_dir,
        trace_out=request.get('trace_out'),
        # In fp32 CUDA's only difference the CPU can show: torch.optim's
        # foreach implementation (its default for CUDA parameters).
        foreach=bool(request.get('as_cuda')),
        op_trace=request.get('op_trace', 'off'),
        record_ops=','.join(request.get('record_ops') or []),
        inspect=bool(request.get('inspect')),
    )


def check_packages():
    """torch, mmengine, mmcv and mmseg importable here, without importing them."""
    missing = [m for m in ('torch', 'mmengine', 'mmcv', 'mmseg')
               if importlib.util.find_spec(m) is None]
    if missing:
        raise StartError(
            'missing_mmseg',
            f'{sys.executable} cannot import {", ".join(missing)}: the Python worker runs '
            f'MMSegmentation\'s own training step; install it into that Python with '
            f'`{sys.executable} -m {PIP_LINE}` (on CUDA, mmcv==2.1.0 instead of mmcv-lite '
            f'for its compiled ops), or pass --python with an interpreter that has it',
            missing=missing, python=sys.executable, install=PIP_LINE)


def counting_allocator(ext_dir):
    """Builds (once, cached by torch) and installs the counting allocator."""
    from torch.utils.cpp_extension import load_inline
    # ninja is looked up on PATH: this interpreter's bin directory first.
    os.environ['PATH'] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', '')
    if ext_dir:
        os.makedirs(ext_dir, exist_ok=True)
    try:
        ext = load_inline(name='segtune_counting_cpu_allocator_v2', cpp_sources=COUNTING_ALLOCATOR,
                          functions=['install', 'current', 'peak', 'reset_peak', 'start_trace',
                                     'set_phase', 'write_trace'],
                          build_directory=ext_dir, verbose=False)
    except Exception as e:  # no compiler, no ninja, no headers
        raise StartError('environment', 'the counting CPU allocator (a C++ extension built '
                         'with torch.utils.cpp_extension.load_inline) could not be built; it '
                         f'needs g++ and ninja: {one_line(e)}')
    ext.install()
    return ext


def stub_mmcv_ext():
    """mmcv-lite has no compiled `mmcv._ext`, which `import mmcv.ops` needs
    (mmseg.utils and mmdet import it): a stand-in whose every op raises, with
    a spec without a loader so that mmengine's `mmcv_full_available()` still
    answers False. The ops MMSeg's models run on the CPU are pure PyTorch."""
    if 'mmcv._ext' in sys.modules or importlib.util.find_spec('mmcv._ext') is not None:
        return False
    ext = types.ModuleType('mmcv._ext')

    def __getattr__(name):
        if name.startswith('__'):
            raise AttributeError(name)

        def op(*args, **kwargs):
            raise NotImplementedError(f'compiled mmcv op `{name}` is not available (mmcv-lite)')
        return op

    ext.__getattr__ = __getattr__
    ext.__spec__ = importlib.machinery.ModuleSpec('mmcv._ext', None)
    sys.modules['mmcv._ext'] = ext
    return True


class AbsentPackages:
    """A meta path finder that answers ModuleNotFoundError for the named
    top-level packages: what importing MMSeg pulls in only for models the
    config does not use (mmdet: ~3 s; transformers, which mmengine imports
    for its Adafactor: ~2 s)."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in self.names:
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return None


def unused_packages(args):
    """The packages the config needs none of: read without its
    custom_imports (which may import anything, and then nothing is left
    out)."""
    try:
        from mmengine.config import Config
        cfg = Config.fromfile(args.config, import_custom_modules=False)
        if cfg.get('custom_imports'):
            return []
        text = json.dumps(cfg.to_dict(), default=str) + ' '.join(args.cfg_options)
    except Exception:  # the real load says why
        return []
    absent = []
    if 'mmdet' not in text and 'MaskFormer' not in text and 'Mask2Former' not in text:
        absent.append('mmdet')
    if 'Adafactor' not in text and 'transformers' not in text:
        absent.append('transformers')
    return absent


def import_mmseg(absent=()):
    warnings.filterwarnings('ignore')
    if absent:
        sys.meta_path.insert(0, AbsentPackages(absent))
    import mmcv.ops  # noqa: F401  (through the stand-in with mmcv-lite)
    try:
        import mmdet.models  # noqa: F401  (Mask2Former's parts, when installed)
    except ImportError:
        pass
    from mmseg.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    from mmengine.logging import MMLogger
    MMLogger.get_instance('mmengine', log_level='ERROR')


def one_line(e):
    text = str(e).strip()
    line = next((l.strip() for l in text.splitlines() if l.strip()), '')
    line = f'{type(e).__name__}: {line}' if line else type(e).__name__
    return line if len(line) <= 300 else line[:300] + '...'


def replace_syncbn(node):
    if isinstance(node, dict):
        if node.get('type') in ('SyncBN', 'MMSyncBN'):
            node['type'] = 'BN'
        for v in node.values():
            replace_syncbn(v)
    elif isinstance(node, (list, tuple)):
        for v in node:
            replace_syncbn(v)


def load_config(args):
    """Config.fromfile (which imports `custom_imports`), the --cfg-options
    as DictAction parses them, then the oracle's changes: SyncBN -> BN, no
    pretrained checkpoints, data_preprocessor.size = the crop."""
    from mmengine.config import Config, DictAction
    try:
        cfg = Config.fromfile(args.config)
        options = {}
        for item in args.cfg_options:
            key, value = item.split('=', maxsplit=1)
            options[key] = DictAction._parse_iterable(value)
        cfg.merge_from_dict(options)
        replace_syncbn(cfg.model)
        cfg.model.pretrained = None
        backbone = cfg.model.backbone
        backbone.init_cfg = None
        if 'pretrained' in backbone:
            backbone.pretrained = None
        cfg.model.data_preprocessor.size = tuple(args.crop)
    except Exception as e:
        raise StartError('config', f'{args.config}: {one_line(e)}')
    return cfg


def pick_device(name):
    import torch
    if name == 'cpu':
        return torch.device('cpu')
    index = int(name.split(':')[1]) if ':' in name else 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        raise StartError('device', f'--device cuda:{index} requested, but this PyTorch '
                         f'({sys.executable}) sees {count} CUDA device(s)')
    return torch.device('cuda', index)


def build_optim_wrapper(model, cfg, args, on_cpu):
    """The config's optim_wrapper; AMP as segtune writes it (AmpOptimWrapper
    with the dtype, dynamic loss scale for fp16). AmpOptimWrapper asserts a
    GPU when built: on the CPU that one check is let pass (its GradScaler
    then disables itself, and its context is CPU autocast)."""
    from mmengine.optim import build_optim_wrapper as build
    from mmengine.optim.optimizer import amp_optimizer_wrapper as amp_module
    ow_cfg = copy.deepcopy(cfg.optim_wrapper)
    for key in ('dtype', 'loss_scale'):
        ow_cfg.pop(key, None)
    if args.accum is not None:
        ow_cfg['accumulative_counts'] = args.accum
    if args.foreach and 'foreach' not in ow_cfg.get('optimizer', {}):
        # What torch.optim does by default for CUDA parameters.
        ow_cfg['optimizer']['foreach'] = True
    if args.amp == 'off':
        ow_cfg['type'] = 'OptimWrapper'
        return build(model, ow_cfg)
    ow_cfg['type'] = 'AmpOptimWrapper'
    ow_cfg['dtype'] = 'bfloat16' if args.amp == 'bf16' else 'float16'
    ow_cfg['loss_scale'] = 'dynamic'
    saved = amp_module.is_cuda_available
    if on_cpu:
        amp_module.is_cuda_available = lambda: True
    try:
        return build(model, ow_cfg)
    finally:
        amp_module.is_cuda_available = saved


def num_classes_and_ignore_index(cfg):
    head = cfg.model.decode_head
    if isinstance(head, (list, tuple)):
        head = head[-1]
    return int(head.num_classes), int(head.get('ignore_index', 255))


def make_batch(args, num_classes, ignore_index, gen):
    """As MMSeg's loader hands a batch over (and segtune's synthetic one):
    B images 3xHxW float32 of integers 0..255 (BGR), B label maps 1xHxW int64
    over the first `gt_segments` classes, `ignore_fraction` of them ignored."""
    import torch
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    h, w = args.crop
    classes = num_classes if args.gt_segments is None else min(args.gt_segments, num_classes)
    inputs, samples = [], []
    for _ in range(args.batch_size):
        img = torch.randint(0, 256, (3, h, w), generator=gen).float()
        seg = torch.randint(0, classes, (1, h, w), generator=gen, dtype=torch.int64)
        if args.ignore_fraction > 0:
            seg.masked_fill_(torch.rand((1, h, w), generator=gen) < args.ignore_fraction,
                             ignore_index)
        sample = SegDataSample()
        sample.gt_sem_seg = PixelData(data=seg)
        sample.set_metainfo(dict(img_path='random.png', seg_map_path='random.png',
                                 ori_shape=(h, w), img_shape=(h, w), pad_shape=(h, w),
                                 scale_factor=(1.0, 1.0), flip=False, flip_direction=None,
                                 reduce_zero_label=False))
        inputs.append(img)
        samples.append(sample)
    nbytes = sum(t.numel() * t.element_size() for t in inputs) + \
        sum(s.gt_sem_seg.data.numel() * 8 for s in samples)
    return dict(inputs=inputs, data_samples=samples), nbytes


class Meter:
    """Live and peak bytes relative to the count before the model build:
    the counting allocator's on the CPU, the caching allocator's on CUDA."""

    def __init__(self, alloc, device):
        import torch
        self.torch = torch
        self.alloc = alloc
        self.cuda = device.type == 'cuda'
        self.device = device
        self.base = 0
        self.base = self.current()

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def current(self):
        if self.cuda:
            return self.torch.cuda.memory_allocated(self.device) - self.base
        return self.alloc.current() - self.base

    def peak(self):
        if self.cuda:
            return self.torch.cuda.max_memory_allocated(self.device) - self.base
        return self.alloc.peak() - self.base

    def reset_peak(self):
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.alloc.reset_peak()

    def device_stats(self):
        if not self.cuda:
            return None
        t = self.torch.cuda
        s = t.memory_stats(self.device)
        free, total = t.mem_get_info(self.device)
        return dict(allocated_current=s.get('allocated_bytes.all.current', 0),
                    allocated_peak=s.get('allocated_bytes.all.peak', 0),
                    reserved_current=s.get('reserved_bytes.all.current', 0),
                    reserved_peak=s.get('reserved_bytes.all.peak', 0),
                    requested_peak=s.get('requested_bytes.all.peak', 0),
                    num_alloc_retries=s.get('num_alloc_retries', 0),
                    num_ooms=s.get('num_ooms', 0), free_bytes=free, total_bytes=total)


def op_tracer_class():
    """`OpTracer`, defined once torch is imported."""
    import functools
    import weakref
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map
    import torch.fx.experimental._config as fx_config
    # nonzero's meta kernel: every element counted as non-zero (an upper
    # bound; exact for segtune's synthetic labels, which ignore no pixel).
    fx_config.meta_nonzero_assume_all_nonzero = True
    dtype_names = {torch.float32: 'f32', torch.float16: 'f16', torch.bfloat16: 'bf16',
                   torch.float64: 'f64', torch.int64: 'i64', torch.int32: 'i32',
                   torch.bool: 'bool', torch.uint8: 'u8'}

    def tensor_text(t):
        dims = 'x'.join(str(d) for d in t.shape) or 's'
        layout = ''
        if t.dim() == 4 and not t.is_contiguous() and \
                t.is_contiguous(memory_format=torch.channels_last):
            layout = ':cl'
        elif not t.is_contiguous():
            layout = ':nc'
        return f't:{dtype_names.get(t.dtype, "other")}:{dims}{layout}'

    def value_text(v):
        if v is None:
            return '-'
        if isinstance(v, torch.Tensor):
            return tensor_text(v)
        if isinstance(v, bool):
            return f'b:{int(v)}'
        if isinstance(v, int):
            return f'i:{v}'
        if isinstance(v, float):
            return f'f:{v}'
        if isinstance(v, (list, tuple)):
            if all(isinstance(x, bool) for x in v) and v:
                return 'm:' + ','.join(str(int(x)) for x in v)
            if all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                return 'l:' + (','.join(str(x) for x in v) or 'e')
            if all(isinstance(x, torch.Tensor) or x is None for x in v):
                return f'n:{len(v)}'
        return '?'

    class OpTracer(TorchDispatchMode):
        """segtune's op-level meta trace, recorded in Python: every ATen op
        runs on the meta device (no compute, no memory), each new output
        storage is an allocation and its end (a weak reference's callback:
        torch keeps a storage's Python object as long as the storage) a
        free, as `segtune-torch`'s shim records them. Ops without a meta
        kernel run on CPU zeros, their outputs made meta (as the shim's
        stand-ins); a number read from a meta tensor (`.item()`) is zero,
        a truth true.
        Kernel calls of `recorded` ops are written with their arguments at
        their place among the events (`src/trial/kernel_calls.rs`)."""

        def __init__(self, recorded):
            super().__init__()
            self.recorded = set(recorded)
            self.events = []
            self.calls = []
            self.live = {}
            self.refs = {}
            self.next_id = 0
            self.code = 0
            self.scope = 0
            self.now = 0
            self.high = 0
            self.tracing = False
            self.stand_ins = set()
            self.scalar_stand_ins = 0

        # The counting allocator's interface (Meter, Phases, run_trial).
        def current(self):
            return self.now

        def peak(self):
            return self.high

        def reset_peak(self):
            self.high = self.now

        def start_trace(self):
            self.tracing = True

        def set_phase(self, code):
            self.code = code

        def write_trace(self, path):
            self.tracing = False
            header = ('# segtune trace v3: id bytes phase scope; kernel calls: k at phase scope op args'
                      if self.calls else '# segtune trace v2: id bytes phase scope')
            try:
                with open(path, 'w') as f:
                    f.write(header + '\n')
                    f.writelines(f'{i} {b} {p} {s}\n' for i, b, p, s in self.events)
                    f.writelines(line + '\n' for line in self.calls)
            except OSError:
                return False
            return True

        def track(self, t):
            if not isinstance(t, torch.Tensor) or t.device.type != 'meta':
                return
            storage = t.untyped_storage()
            key = storage._cdata
            nbytes = storage.nbytes()
            if key in self.live or nbytes == 0:
                return
            ident = self.next_id
            self.next_id += 1
            self.live[key] = (ident, nbytes)
            self.refs[key] = weakref.ref(storage, functools.partial(self.freed, key))
            self.now += nbytes
            self.high = max(self.high, self.now)
            if self.tracing:
                self.events.append((ident, nbytes, self.code, self.scope))

        def freed(self, key, _ref):
            found = self.live.pop(key, None)
            self.refs.pop(key, None)
            if found is None:
                return
            ident, nbytes = found
            self.now -= nbytes
            if self.tracing:
                self.events.append((ident, -nbytes, self.code, self.scope))

        def op_name(self, func):
            schema = func._schema
            return schema.name + (f'.{schema.overload_name}' if schema.overload_name else '')

        def call_text(self, func, args, kwargs):
            schema = func._schema
            name = self.op_name(func)
            if schema.name not in self.recorded and name not in self.recorded:
                return None
            values = []
            for i, a in enumerate(schema.arguments):
                if i < len(args):
                    values.append(args[i])
                elif a.name in kwargs:
                    values.append(kwargs[a.name])
                else:
                    values.append(a.default_value if a.has_default_value() else None)
            return name + ''.join(' ' + value_text(v) for v in values)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            metas = [t for t in tree_leaves((args, kwargs))
                     if isinstance(t, torch.Tensor) and t.device.type == 'meta']
            if func is torch.ops.aten._local_scalar_dense.default and metas:
                self.scalar_stand_ins += 1
                t = metas[0]
                # A truth read from a meta tensor is an assertion or a
                # finiteness check (`assert (a == b).all()`): true.
                return True if t.dtype == torch.bool else (0.0 if t.is_floating_point() else 0)
            call = self.call_text(func, args, kwargs) if metas else None
            if func is torch.ops.aten.add.Tensor and self.code % 8 == BACKWARD:
                inplace = self.accumulation_in_place(args, kwargs)
                if inplace is not None:
                    return inplace
            try:
                out = func(*args, **kwargs)
            except (NotImplementedError, RuntimeError) as e:
                if not metas or 'meta' not in str(e).lower():
                    raise
                out = self.on_cpu_zeros(func, args, kwargs)
            for t in tree_leaves(out):
                self.track(t)
            if call is not None:
                self.calls.append(f'k {len(self.events)} {self.code} {self.scope} {call}')
            return out

        def accumulation_in_place(self, args, kwargs):
            """The autograd engine sums two gradients of one input in place
            when it holds the last reference to one of them and its storage
            (`InputBuffer::accumulate`). Under a Python dispatch mode every
            tensor has a Python object, which makes the engine's check fail:
            the check is made here instead (the counts seen from a mode: 4
            tensor references and 2 storage ones, this probe's included)."""
            if kwargs or len(args) != 2:
                return None
            old, new = args
            if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)) or \
                    old.device.type != 'meta' or old.shape != new.shape or old.dtype != new.dtype:
                return None

            def last_reference(t):
                return t._use_count() <= 4 and t.is_contiguous() and \
                    torch._C._storage_Use_Count(t.untyped_storage()._cdata) <= 2

            if last_reference(old):
                return old.add_(new)
            if last_reference(new):
                return new.add_(old)
            return None

        def on_cpu_zeros(self, func, args, kwargs):
            """An op without a meta kernel: run on CPU zeros of the same
            shapes, the outputs made meta; a mutated argument is returned."""
            self.stand_ins.add(self.op_name(func))

            def to_cpu(t):
                if isinstance(t, torch.Tensor) and t.device.type == 'meta':
                    return torch.zeros_strided(t.shape, t.stride(), dtype=t.dtype) \
                        if hasattr(torch, 'zeros_strided') else \
                        torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).zero_()
                return t

            def to_meta(t):
                if isinstance(t, torch.Tensor) and t.device.type == 'cpu':
                    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device='meta')
                return t

            out = func(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))
            if func._schema.is_mutable and args and isinstance(args[0], torch.Tensor) \
                    and len(func._schema.returns) == 1:
                return args[0]
            return tree_map(to_meta, out)

    return OpTracer


def mark_scopes(model, tracer):
    """The model's parts as the trace's scopes: each direct child of the
    segmentor (backbone, neck, decode_head, auxiliary_head) while its
    forward runs, and `<head>.loss` while a head computes its losses.
    Returns the names by id (id 0: outside any part)."""
    names = ['']

    def scoped(name, fn):
        names.append(name)
        ident = len(names) - 1

        def wrapper(*args, **kwargs):
            previous = tracer.scope
            tracer.scope = ident
            try:
                return fn(*args, **kwargs)
            finally:
                tracer.scope = previous
        return wrapper

    for name, child in model.named_children():
        if name == 'data_preprocessor':
            continue
        child.forward = scoped(name, child.forward)
        if hasattr(child, 'loss_by_feat'):
            child.loss_by_feat = scoped(f'{name}.loss', child.loss_by_feat)
    return names


# segtune's phase codes (src/trial/trace.rs): step * 8 + phase.
SETUP, FORWARD, BACKWARD, OPTIMIZER, DATA, PREPROCESS = range(6)


class Phases:
    """The step and phase the allocations belong to, in the trace."""

    def __init__(self, alloc):
        self.alloc = alloc if alloc is not None and hasattr(alloc, 'set_phase') else None
        self.step = 0

    def enter(self, phase):
        if self.alloc is not None:
            self.alloc.set_phase(self.step * 8 + phase)


def mark_phases(model, ow, meter, phase, phases):
    """The optimizer wrapper's backward, wrapped to read the peak of the
    forward (preprocessing, forward, losses) and of the backward, and with
    the data preprocessor's forward to mark the trace's phases."""
    backward = ow.backward

    def backward_with_marks(loss, **kwargs):
        meter.sync()
        phase['forward'] = meter.peak()
        meter.reset_peak()
        phases.enter(BACKWARD)
        backward(loss, **kwargs)
        meter.sync()
        phase['backward'] = meter.peak()
        meter.reset_peak()
        phases.enter(OPTIMIZER)

    ow.backward = backward_with_marks
    preprocess = model.data_preprocessor.forward

    def preprocess_with_marks(*args, **kwargs):
        phases.enter(PREPROCESS)
        out = preprocess(*args, **kwargs)
        phases.enter(FORWARD)
        return out

    model.data_preprocessor.forward = preprocess_with_marks


def one_step(model, ow, meter, phase, phases, data, index, measured):
    meter.sync()
    before = meter.current()
    phase.clear()
    meter.reset_peak()
    phases.enter(FORWARD)
    started = time.perf_counter()
    log_vars = model.train_step(data, ow)
    meter.sync()
    seconds = time.perf_counter() - started
    optimizer = meter.peak()
    loss = float(log_vars['loss']) if 'loss' in log_vars else None
    record = dict(step=index + 1, measured=measured, seconds=seconds, bytes_before=before,
                  peak_bytes=max(phase.get('forward', 0), phase.get('backward', 0), optimizer),
                  bytes_after=0, forward_peak=phase.get('forward', 0),
                  backward_peak=phase.get('backward', 0), optimizer_peak=optimizer, loss=loss,
                  cuda=meter.device_stats())
    return record, log_vars


def status_of(error):
    import torch
    text = str(error)
    low = text.lower()
    if ONE_VALUE_PER_CHANNEL in text:
        return 'infeasible', next(l for l in text.splitlines() if ONE_VALUE_PER_CHANNEL in l).strip()
    if isinstance(error, torch.cuda.OutOfMemoryError) or any(
            s in low for s in ('out of memory', "can't allocate memory", 'failed to allocate')):
        return 'oom', one_line(error)
    return 'error', one_line(error)


def torch_release(version):
    """`2.11.0+cu130` as the MAJOR.MINOR segtune reads, within 1.8..2.11."""
    major, minor = (int(''.join(c for c in p if c.isdigit()) or 0)
                    for p in version.split('+')[0].split('.')[:2])
    major, minor = max((1, 8), min((2, 11), (major, minor)))
    return f'{major}.{minor}'


def new_report(args, device):
    import torch
    import mmseg
    return dict(
        status='ok', message=None, device=str(device), batch_size=args.batch_size,
        crop=list(args.crop), amp=args.amp, accumulative_counts=1, mode='train',
        torch=torch_release(torch.__version__), gpus=1, as_cuda=bool(args.foreach), optimizer='',
        params_total=0, params_trainable=0, params_by_prefix={}, param_bytes=0,
        buffer_bytes=0, bytes_after_model_build=0, batch_bytes=0, bytes_before_step1=0,
        peak_bytes=None, cuda_peak_allocated_bytes=None, cuda_peak_reserved_bytes=None,
        optimizer_state_bytes=0, forward_flops=0.0, recompute_flops=0.0,
        step_time_median_s=None, images_per_s=None, steps=[], worker='python',
        python=dict(executable=sys.executable, torch=torch.__version__,
                    mmseg=mmseg.__version__))


def set_params(report, model):
    prefix = {}
    for name, p in model.named_parameters():
        d = prefix.setdefault(name.split('.')[0], dict(total=0, trainable=0))
        d['total'] += p.numel()
        d['trainable'] += p.numel() if p.requires_grad else 0
    report['params_by_prefix'] = prefix
    report['params_total'] = sum(d['total'] for d in prefix.values())
    report['params_trainable'] = sum(d['trainable'] for d in prefix.values())
    report['param_bytes'] = sum(p.numel() * p.element_size() for p in model.parameters())
    report['buffer_bytes'] = sum(b.numel() * b.element_size() for b in model.buffers())


def finish(report):
    """The measured steps' aggregates, as TrialReport::finish makes them."""
    steps = report['steps']
    cuda = [s['cuda'] for s in steps if s['cuda']]
    if cuda:
        report['cuda_first_step_peak_allocated_bytes'] = cuda[0]['allocated_peak']
    measured = [s for s in steps if s['measured']]
    if not measured:
        return
    if not any(s['cuda'] for s in measured):
        report['peak_bytes'] = max(s['peak_bytes'] for s in measured)
    else:
        report['cuda_peak_allocated_bytes'] = max(s['cuda']['allocated_peak'] for s in measured)
        report['cuda_peak_reserved_bytes'] = max(s['cuda']['reserved_peak'] for s in measured)
    times = sorted(s['seconds'] for s in measured)
    n = len(times)
    median = times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2
    report['step_time_median_s'] = median
    report['images_per_s'] = report['batch_size'] / median


def run_steps(args, cfg, model, ow, meter, phases, report):
    import torch
    num_classes, ignore_index = num_classes_and_ignore_index(cfg)
    phase = {}
    mark_phases(model, ow, meter, phase, phases)
    gen = torch.Generator().manual_seed(args.seed + 1)
    for index in range(args.warmup + args.steps):
        phases.step = index + 1
        phases.enter(DATA)
        data, nbytes = make_batch(args, num_classes, ignore_index, gen)
        if index == 0:
            report['batch_bytes'] = nbytes
            report['bytes_before_step1'] = meter.current()
        record, log_vars = one_step(model, ow, meter, phase, phases, data, index,
                                    index >= args.warmup)
        del data
        gc.collect()
        record['bytes_after'] = meter.current()
        report['steps'].append(record)
        loss = record['loss']
        if loss is None or loss != loss or loss in (float('inf'), float('-inf')):
            report['status'] = 'non_finite_loss'
            report['message'] = f'the loss is {loss} at step {index + 1}'
            return


def optimizer_state_bytes(ow):
    import torch
    return sum(v.numel() * v.element_size() for state in ow.optimizer.state.values()
               for v in state.values() if torch.is_tensor(v))


def dropout_as_on_cuda():
    """Makes F.dropout of a meta tensor take the path ATen's dropout takes
    on CUDA (Dropout.cpp, `is_fused_kernel_acceptable`: a CUDA input, 0 < p
    < 1, not in place): the fused `native_dropout`, which keeps a bool mask
    for backward. On the meta device ATen takes the CPU path instead, a
    float noise tensor of the input's size (4 bytes an element, not 1).
    Returns the function that undoes it."""
    import torch
    import torch.nn.functional as F
    original = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if (training and not inplace and 0 < p < 1 and isinstance(input, torch.Tensor)
                and input.device.type == 'meta' and input.numel() > 0):
            return torch.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    F.dropout = dropout

    def restore():
        F.dropout = original
    return restore


def run_trial(args, alloc, device):
    import torch
    from mmseg.registry import MODELS
    cfg = load_config(args)
    report = new_report(args, device)
    gc.collect()
    meter = Meter(alloc, device)
    phases = Phases(alloc)
    tracer = alloc if args.op_trace == 'meta' else None
    if args.trace_out:
        if phases.alloc is None:
            raise StartError('config', '--trace-out traces the CPU allocator: it needs --device cpu')
        alloc.start_trace()
        phases.enter(SETUP)
    torch.manual_seed(args.seed)
    try:
        model = MODELS.build(cfg.model)
        model.init_weights()
        model.train()
        if tracer is not None:
            # Built on the CPU (untraced: MMSeg's modules read values at
            # build time), then every parameter and buffer made meta.
            restore_dropout = dropout_as_on_cuda()
            tracer.__enter__()
            report['model_scopes'] = mark_scopes(model, tracer)
        model.to(device)
    except Exception as e:
        raise StartError('config', f'{args.config}: the model does not build: {one_line(e)}')
    set_params(report, model)
    report['bytes_after_model_build'] = meter.current()
    try:
        ow = build_optim_wrapper(model, cfg, args, device.type == 'cpu')
    except Exception as e:
        raise StartError('config', f'{args.config}: the optim_wrapper does not build: {one_line(e)}')
    report['optimizer'] = type(ow.optimizer).__name__
    report['accumulative_counts'] = int(getattr(ow, '_accumulative_counts', 1))
    try:
        run_steps(args, cfg, model, ow, meter, phases, report)
    except Exception as e:  # the step's failure is the report's status
        report['status'], report['message'] = status_of(e)
    if tracer is not None:
        tracer.__exit__(None, None, None)
        restore_dropout()
        report['op_trace'] = 'meta'
        if tracer.stand_ins:
            # TrialReport's fields: the ops that ran on CPU stand-ins, and
            # how many values read from meta tensors were stood in for.
            report['meta_ops_on_cpu'] = sorted(tracer.stand_ins)
        report['meta_stand_ins'] = tracer.scalar_stand_ins
    if args.trace_out and not alloc.write_trace(args.trace_out):
        raise StartError('environment', f'cannot write the trace to {args.trace_out}')
    report['optimizer_state_bytes'] = optimizer_state_bytes(ow)
    finish(report)
    return report


def inspect(args):
    """`segtune inspect --python-worker`: the model MMSeg builds (with the
    config's custom_imports), its types and parameters per top-level module,
    as segtune's ModelSummary."""
    from mmseg.registry import MODELS
    cfg = load_config(args)
    model_cfg = cfg.model

    def type_of(node):
        return node.get('type') if isinstance(node, dict) else None
    summary = {
        'config': args.config,
        'model_type': type_of(model_cfg),
        'backbone_type': type_of(model_cfg.get('backbone')),
        'decode_head_type': type_of(model_cfg.get('decode_head')),
        'supported': False,
        'note': f'built by MMSeg itself in {sys.executable} (the Python worker), '
                'with the config\'s custom_imports imported',
    }
    try:
        model = MODELS.build(model_cfg)
    except Exception as e:
        summary['reason'] = f'MMSeg cannot build the model: {one_line(e)}'
        return summary
    by_prefix = {}
    for name, p in model.named_parameters():
        entry = by_prefix.setdefault(name.split('.')[0], {'total': 0, 'trainable': 0})
        entry['total'] += p.numel()
        entry['trainable'] += p.numel() if p.requires_grad else 0
    summary.update(
        supported=True,
        params_total=sum(e['total'] for e in by_prefix.values()),
        params_trainable=sum(e['trainable'] for e in by_prefix.values()),
        params_by_prefix=by_prefix,
    )
    return summary


def main(argv):
    args = parse_args(argv)
    # This file runs from a temporary directory: the user's working directory
    # stands in for it on sys.path, so that modules beside the config (or the
    # project's packages) import as `custom_imports` names them.
    sys.path[0] = os.getcwd()
    try:
        check_packages()
        import torch
        if args.threads:
            torch.set_num_threads(args.threads)
        device = pick_device(args.device)
        if args.op_trace == 'meta':
            if device.type != 'cpu':
                raise StartError('device', '--op-trace meta runs on the meta device, not on a GPU')
            device = torch.device('meta')
            alloc = op_tracer_class()(args.record_ops.split(',') if args.record_ops else [])
        else:
            # An inspection builds the model only: nothing to count.
            counted = device.type == 'cpu' and not args.inspect
            alloc = counting_allocator(args.ext_dir) if counted else None
        stub_mmcv_ext()
        try:
            import_mmseg(unused_packages(args))
        except Exception as e:
            raise StartError('missing_mmseg', f'{sys.executable} cannot import MMSegmentation: '
                             f'{one_line(e)}; install it with `{sys.executable} -m {PIP_LINE}`',
                             python=sys.executable, install=PIP_LINE)
        if args.inspect:
            emit(inspect(args), 0)
        report = run_trial(args, alloc, device)
    except StartError as e:
        emit({'python_worker_error': dict(kind=e.kind, message=str(e), **e.extra)}, 2)
    emit(report, 0 if report['status'] == 'ok' else 1)


if __name__ == '__main__':
    main(sys.argv[1:])
