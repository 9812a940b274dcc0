"""What a decode step of the static loop (graph_decode.py) spends its time on: torch.profiler around a
few steps, each op (CPU) or kernel (CUDA) put in a class by the module it ran in and its name.

On a GPU the graph loop replays a step as one CUDA graph, so the profiler sees no ops there; the
classes come from the same steps run without graphs (`static_sample(graphs=False)`: the same kernels
on the same buffers, each launched from Python), whose device time per op is the kernel's. The graph's
own replays are timed beside them: the step's wall time against the kernels' busy time is what the
graph still leaves idle between kernels.

Classes (CLASSES): projections (the layers' Linear modules), output_layer (the vocabulary projection),
attention (the attention function: scores, softmax, weighted values), norms, rotary (the rotary
module's cos/sin and their application to q/k), sampling (after the model: temperature, top-p, the
inverse-CDF draw, greedy argmax, the stop checks), copies (cache writes, casts, concatenations, mask
updates), other (embedding lookup, activation, residual adds; on a CPU also the Python between ops,
`host`). `non_matrix_share`: the share of the busy time not in matrix products (mm, addmm, bmm, SDPA).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch

CLASSES = ("projections", "output_layer", "attention", "norms", "rotary", "sampling", "copies", "other", "host")
PREFIX = "rlpr::"
STEP = PREFIX + "decode_step"
# ops that move or lay out data rather than compute (by aten name)
COPY_OPS = frozenset({"aten::copy_", "aten::index_copy_", "aten::index_put_", "aten::_index_put_impl_", "aten::cat",
                      "aten::clone", "aten::contiguous", "aten::index_select", "aten::fill_", "aten::index_fill_",
                      "aten::zero_", "aten::masked_fill", "aten::masked_fill_", "aten::_to_copy", "aten::to",
                      "aten::index", "aten::empty", "aten::empty_like", "aten::new_empty", "aten::zeros",
                      "aten::empty_strided", "aten::resize_"})
MATRIX_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation",
                        "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
                        "aten::_scaled_dot_product_cudnn_attention", "aten::_flash_attention_forward",
                        "aten::_efficient_attention_forward", "aten::_scaled_dot_product_flash_attention_for_cpu",
                        "aten::mkldnn_linear", "mkldnn::_linear_pointwise", "aten::_weight_int4pack_mm"})


def module_label(model, module) -> str | None:
    """The scope a module's ops are counted in (None: its parent's)."""
    name = type(module).__name__
    if module is model.get_output_embeddings():
        return "output_layer"
    if isinstance(module, torch.nn.Linear):
        return "projections"
    if isinstance(module, torch.nn.Embedding):
        return "other"
    if name.endswith(("RMSNorm", "LayerNorm")):
        return "norms"
    if "RotaryEmbedding" in name:
        return "rotary"
    if name.endswith("Attention"):
        return "attention_module"  # its own ops: rotary applied to q/k, the cache write, reshapes
    if module is model:
        return "model"
    return None


def op_class(op: str, scope: str | None) -> str:
    """The class of an op `op` whose innermost labelled scope is `scope`."""
    if scope in ("projections", "output_layer", "attention", "norms", "rotary", "copies", "other"):
        return scope
    copy = op in COPY_OPS
    if scope == "attention_module":
        return "copies" if copy else "rotary"  # elementwise ops on q/k there: the rotary embedding's
    if scope == "model":
        return "copies" if copy else "other"  # residual adds, activation, gate * up
    return "copies" if copy else "sampling"  # the step outside the model


@contextlib.contextmanager
def scopes(model):
    """Within the block, each labelled module's ops (and the static loop's attention function, and
    each decode step) run inside a `record_function` named PREFIX + label."""
    from transformers import AttentionInterface

    from rlpr.rollout import fused_step, graph_decode

    handles, stack = [], []

    def enter(label):
        def pre(module, args):
            scope = torch.profiler.record_function(PREFIX + label)
            scope.__enter__()
            stack.append(scope)
        return pre

    def leave(module, args, output):
        stack.pop().__exit__(None, None, None)

    for module in model.modules():
        label = module_label(model, module)
        if label is not None:
            handles += [module.register_forward_pre_hook(enter(label)), module.register_forward_hook(leave)]
    attention, step = graph_decode.grouped_decode_attention, graph_decode._step

    def scoped_attention(*args, **kwargs):
        with torch.profiler.record_function(PREFIX + "attention"):
            return attention(*args, **kwargs)

    def scoped_step(*args, **kwargs):
        with torch.profiler.record_function(STEP):
            return step(*args, **kwargs)

    AttentionInterface.register(graph_decode.DECODE_ATTENTION, scoped_attention)
    graph_decode._step = scoped_step
    fused_step.SCOPE = lambda label: torch.profiler.record_function(PREFIX + label)  # its fused products
    try:
        yield
    finally:
        fused_step.SCOPE = None
        graph_decode._step = step
        AttentionInterface.register(graph_decode.DECODE_ATTENTION, attention)
        for h in handles:
            h.remove()


def _scope(event) -> tuple[str | None, bool]:
    """The innermost labelled scope above `event` and whether it lies within a decode step."""
    label, parent = None, event.cpu_parent
    while parent is not None:
        if parent.name.startswith(PREFIX):
            if parent.name == STEP:
                return label, True
            label = label or parent.name[len(PREFIX):]
        parent = parent.cpu_parent
    return label, False


def classify(events, steps: int, cuda: bool) -> dict:
    """Per step: time per class (ms), ops (CPU) or kernels (CUDA), the non-matrix share, the top ops."""
    per_class, per_op, count = defaultdict(float), defaultdict(lambda: [0.0, 0]), 0
    matrix, products = 0.0, 0
    for e in events:
        if e.device_type != torch.autograd.DeviceType.CPU:
            continue
        if e.name.startswith(PREFIX):  # a scope: on a CPU its self time is the Python around its ops
            if not cuda and (e.name == STEP or _scope(e)[1]):
                per_class["host"] += e.self_cpu_time_total
            continue
        label, inside = _scope(e)
        if not inside:
            continue
        t = e.self_device_time_total if cuda else e.self_cpu_time_total
        # CUDA: the kernels the op launched; CPU: the ops called from Python (not from within another op)
        n = len(e.kernels) if cuda else int(e.cpu_parent is None or e.cpu_parent.name.startswith(PREFIX))
        count += n
        cls = op_class(e.name, label)
        per_class[cls] += t
        per_op[e.name][0] += t
        per_op[e.name][1] += n
        if e.name in MATRIX_OPS:
            matrix += t
            products += 1
    busy = sum(v for k, v in per_class.items() if k != "host")
    total = busy + per_class.get("host", 0.0)
    ms = {k: per_class.get(k, 0.0) / 1e3 / steps for k in CLASSES if k in per_class}
    top = sorted(per_op.items(), key=lambda kv: -kv[1][0])[:12]
    per = ("kernels" if cuda else "calls") + "_per_step"
    return {"kernels_per_step" if cuda else "ops_per_step": count / steps,
            "busy_ms_per_step": busy / 1e3 / steps,
            "class_ms_per_step": ms,
            "class_share": {k: v * 1e3 * steps / total for k, v in ms.items()} if total else {},
            "matrix_ms_per_step": matrix / 1e3 / steps,
            "matrix_products_per_step": products / steps,
            "non_matrix_share": 1 - matrix / busy if busy else None,
            "top_ops": [{"op": name, "ms_per_step": t / 1e3 / steps, per: n / steps} for name, (t, n) in top]}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _prefill(model, ids: torch.Tensor, attn: torch.Tensor):
    """The cache of every prompt but its last token (as the engine's shared prefill hands the loop)."""
    from transformers.cache_utils import DynamicCache

    from rlpr.model.forward import cache_kwargs, output_cache, position_ids_from_mask

    head = attn[:, :-1]
    return output_cache(model(input_ids=ids[:, :-1], attention_mask=head, position_ids=position_ids_from_mask(head),
                              **cache_kwargs(model, DynamicCache(config=model.config)), use_cache=True,
                              logits_to_keep=1))


@torch.no_grad()
def profile_decode(model, ids: torch.Tensor, attn: torch.Tensor, sampler, *, steps: int, eos: int, pad: int) -> dict:
    """Profile `steps` decode steps of the static loop on `model` (the rows and prompts `ids`, prefilled
    once), forced to full length, after one unprofiled warm-up call: the classes from steps run without
    graphs, and on CUDA the graph replays of the same steps timed. `sampler()`: a fresh PerRowSampler
    (or None: greedy)."""
    from torch.profiler import ProfilerActivity, profile

    from rlpr.rollout.graph_decode import static_sample

    device = ids.device
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    kw = dict(eos=eos, pad=pad, cache=_prefill(model, ids, attn) if ids.shape[1] > 1 else None)
    out = {"device": device.type, "rows": ids.shape[0], "context": ids.shape[1], "steps": steps,
           "mode": "the static loop's steps without graphs (the kernels a graph replays), under torch.profiler"}
    with scopes(model):
        static_sample(model, ids, attn, sampler(), graphs=False, max_new_tokens=steps, min_new_tokens=steps, **kw)
        with profile(activities=activities) as prof:
            _sync(device)
            tick = time.perf_counter()
            static_sample(model, ids, attn, sampler(), graphs=False, max_new_tokens=steps, min_new_tokens=steps, **kw)
            _sync(device)
        out["profiled_ms_per_step"] = 1e3 * (time.perf_counter() - tick) / steps  # with the profiler's own cost
        out.update(classify(prof.events(), steps, cuda))
    if cuda:
        out["graph"] = graph_replays(model, ids, attn, sampler, steps, **kw)
    return out


def graph_replays(model, ids, attn, sampler, steps: int, **kw) -> dict:
    """The graph loop on the same rows: wall ms per step (the difference of a call of 2 x `steps` and
    one of `steps`, so the call's set-up cancels), and the kernels the profiler sees in one call's
    replays (CUPTI reports a graph's kernels on recent drivers; the call's few set-up copies are
    among them; none seen is reported as such)."""
    from torch.profiler import ProfilerActivity, profile

    from rlpr.rollout.graph_decode import static_sample

    def call(n):
        torch.cuda.synchronize()
        tick = time.perf_counter()
        static_sample(model, ids, attn, sampler(), graphs=True, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - tick

    call(2 * steps)  # capture every graph both calls replay
    wall = (call(2 * steps) - call(steps)) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call(steps)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time_total for e in kernels) / 1e3 / steps
    return {"wall_ms_per_step": 1e3 * wall, "kernels_seen_per_step": len(kernels) / steps,
            "kernel_busy_ms_per_step": busy if kernels else None,
            "idle_share": 1 - busy / (1e3 * wall) if kernels and wall > 0 else None}
