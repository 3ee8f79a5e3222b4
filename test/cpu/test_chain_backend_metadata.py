"""CPU tier: what the chain backends build and hand the kernel, in-process with SGLang's
``TritonAttnBackend`` methods and the kernel replaced by stand-ins.

* construction: the kernel's static shape read from the KV pool's first layer of this rank (the
  rope tile split off the key width), the KV setups refused (with the refusal's fields), the log
  line naming the shape and the attention kind;
* sizing: the fp32 scratch of ``init_cuda_graph_state`` covers every bucket up to ``max_bs`` and
  no more, and stays fp32 on the backend's device whatever torch's defaults are (SGLang loads
  models under the model's default dtype);
* metadata: at capture, views of the graph's static ``req_pool_indices`` / ``seq_lens`` and the
  static scratch; at replay, nothing rebuilt; eager, the static scratch when it is large enough
  for the batch, else a fresh one; every other mode is SGLang's own;
* the forward: every argument of the kernel launch, the KV write, the result's layout, the layer
  features refused with their exact messages, and every argument passed through to SGLang's
  forward for the modes the backend does not serve."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_verify_graph import chain_backend as cb
from sglang_verify_graph.compat import sglang_adapter as adapter
from sglang_verify_graph.env import ENV_TEST_FAULT
from sglang_verify_graph.errors import VerifyGraphConfigError
from sglang_verify_graph.kernel import ChainVerifyShape, choose_num_kv_splits, workspace_numel

from cpu_stubs import chain_backend_stub, chain_config, forward_mode

BACKENDS = {cb.ChainVerifyTritonBackend: ("TARGET_VERIFY", False, "remove --enable-verify-cuda-graph for this model"),
            cb.ChainDraftExtendTritonBackend: ("DRAFT_EXTEND_V2", True, "set SGLANG_VERIFY_GRAPH_DRAFT_EXTEND=upstream")}
IDS = ["verify", "draft-extend"]
PARENT = adapter.triton_attn_backend_cls()


# ---- construction --------------------------------------------------------------------------------
def test_rope_tile_splits_the_trailing_part_of_the_key_width():
    assert [cb.rope_tile(d) for d in (576, 192, 128, 80, 96, 64, 100, 256, 512 + 128)] == \
        [64, 64, 0, 16, 32, 0, 0, 0, 128]


@pytest.fixture
def triton_init(monkeypatch):
    """``settings``: what the stand-in for SGLang's ``__init__`` sets (a bf16 model, a
    ``[slots, heads, dim]`` bf16 KV pool holding only the layers in ``layers``, each its own K and
    V; ``start_layer`` None for a pool without the attribute). ``settings["runner"]``: the model
    runner the stand-in received."""
    settings = dict(sliding_window_size=None, use_sliding_window_kv_pool=False, dcp_size=1,
                    enable_deterministic=False, num_head=4, use_mla=False, start_layer=0,
                    layers=(0,), k_shape=(64, 2, 16), v_shape=(64, 2, 16), dtype=torch.bfloat16)

    def init(self, model_runner, *args, **kwargs):
        s = dict(settings)
        settings["runner"] = model_runner
        bufs = {i: (torch.zeros(s["k_shape"], dtype=s["dtype"]), torch.zeros(s["v_shape"], dtype=s["dtype"]))
                for i in s.pop("layers")}
        pool = SimpleNamespace(get_key_buffer=lambda i: bufs[i][0], get_value_buffer=lambda i: bufs[i][1],
                               layer_num=len(bufs))
        if s["start_layer"] is not None:
            pool.start_layer = s["start_layer"]
        self.token_to_kv_pool = pool
        for name in ("k_shape", "v_shape", "dtype", "start_layer", "runner"):
            s.pop(name, None)
        self.__dict__.update(s)

    monkeypatch.setattr(PARENT, "__init__", init)
    monkeypatch.setattr(adapter, "kv_translation_active", lambda backend: False)
    return settings


RUNNER = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
def test_the_shape_is_read_from_the_pool(triton_init, cls):
    backend = cls(RUNNER, chain_config())
    assert triton_init["runner"] is RUNNER
    assert backend.chain_shape == ChainVerifyShape(4, 2, 16, 16, 3, 0)
    triton_init.update(num_head=8, k_shape=(64, 1, 576), v_shape=(64, 1, 512), use_mla=True)
    assert cls(RUNNER, chain_config(num_draft_tokens=4)).chain_shape == ChainVerifyShape(8, 1, 576, 512, 4, 64)


@pytest.mark.parametrize("start_layer, layers", [(None, (0,)), (0, (0,)), (3, (3, 4))],
                         ids=["no-attribute", "first-rank", "pipeline-stage-from-3"])
def test_the_pool_is_read_at_its_first_layer(triton_init, start_layer, layers):
    triton_init.update(start_layer=start_layer, layers=layers)
    cb.ChainVerifyTritonBackend(RUNNER, chain_config())  # another layer id: KeyError


@pytest.mark.parametrize("window, built", [(None, True), (0, True), (1, False), (4096, False)])
def test_a_sliding_window_backend_is_refused(triton_init, window, built):
    triton_init.update(sliding_window_size=window)
    if built:
        cb.ChainVerifyTritonBackend(RUNNER, chain_config())
    else:
        with pytest.raises(VerifyGraphConfigError, match="sliding-window attention"):
            cb.ChainVerifyTritonBackend(RUNNER, chain_config())


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
@pytest.mark.parametrize("k_shape, v_shape", [((4, 16, 2, 16), (64, 2, 16)), ((64, 2, 16), (4, 16, 2, 16))],
                         ids=["paged-k", "paged-v"])
def test_a_page_major_key_or_value_buffer_is_refused_with_the_refusals_fields(triton_init, cls, k_shape, v_shape):
    triton_init.update(k_shape=k_shape, v_shape=v_shape)
    with pytest.raises(VerifyGraphConfigError) as info:
        cls(RUNNER, chain_config())
    e = info.value
    assert e.problem == f"the chain {cls.role} attention does not support this model's KV setup"
    assert e.flag == "model / KV cache"
    assert e.value == "a page-major KV layout (drop --enable-page-major-kv-layout)"
    assert e.fix == BACKENDS[cls][2]


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
@pytest.mark.parametrize("mla", [False, True])
def test_construction_logs_the_shape_and_the_attention_kind(triton_init, caplog, cls, mla):
    triton_init.update(use_mla=mla)
    with caplog.at_level(logging.INFO, logger="sglang_verify_graph"):
        backend = cls(RUNNER, chain_config())
    kind = "absorbed MLA" if mla else "MHA/GQA"
    assert [r.getMessage() for r in caplog.records if r.name == "sglang_verify_graph"] == [f"chain {cls.role} attention: {backend.chain_shape} ({kind})"]


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
def test_a_new_backend_serves_an_eager_forward_before_any_graph_state(triton_init, cls):
    backend = cls(RUNNER, chain_config())
    backend.device, backend.device_core_count = "cpu", 8
    mode = forward_mode(BACKENDS[cls][0])
    backend.init_forward_metadata(SimpleNamespace(forward_mode=mode, batch_size=1,
                                                  req_pool_indices=torch.zeros(1, dtype=torch.int64),
                                                  seq_lens=torch.tensor([5])))
    assert backend._chain_meta.att_out.numel() == backend._workspace_for(1)[0]


def test_wrong_layer_kv_refusal_fields():
    with pytest.raises(VerifyGraphConfigError) as info:
        cb.wrong_kv_layer(0, 0, 1)
    assert info.value.flag == ENV_TEST_FAULT
    assert info.value.value == f"{cb.WRONG_LAYER_KV} (KV pool layers: 1)"


def test_wrong_layer_kv_on_a_pool_without_a_start_layer_counts_from_zero():
    backend, _, _, _ = chain_backend_stub(cb.ChainVerifyTritonBackend)
    backend.token_to_kv_pool = SimpleNamespace(layer_num=3)
    backend.verify_cfg = chain_config(test_fault=cb.WRONG_LAYER_KV)
    assert [backend._kv_layer_id(i) for i in range(3)] == [1, 0, 1]


# ---- sizing --------------------------------------------------------------------------------------
def _sized(cls=cb.ChainVerifyTritonBackend, cores=132, **cfg):
    backend, layer, q, k = chain_backend_stub(cls)
    backend.device, backend.device_core_count, backend._chain_static = "cpu", cores, None
    backend.verify_cfg = chain_config(**cfg)
    return backend, layer, q, k


def test_the_configs_split_count_is_used():
    backend, *_ = _sized(num_kv_splits=4)
    assert [backend.num_kv_splits_for(bs) for bs in (1, 8, 32)] == [4, 4, 4]
    backend, *_ = _sized()
    assert backend.num_kv_splits_for(1) == choose_num_kv_splits(backend.chain_shape, 1, 132)


@pytest.mark.parametrize("max_bs, next_needs_more", [(1, True), (2, True), (5, False)])
def test_the_graph_scratch_covers_every_bucket_and_no_more(max_bs, next_needs_more):
    backend, *_ = _sized()
    backend.init_cuda_graph_state(max_bs, max_bs * 3)
    need = [backend._workspace_for(bs) for bs in range(1, max_bs + 1)]
    out, lse = backend._chain_static
    assert backend.chain_workspace_numel == (out.numel(), lse.numel())
    assert (out.numel(), lse.numel()) == (max(n for n, _ in need), max(n for _, n in need))
    assert (backend._workspace_for(max_bs + 1)[0] > out.numel()) is next_needs_more


@pytest.fixture
def model_defaults():
    """torch's default dtype and device as SGLang may leave them around a model: bf16 on ``meta``."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            yield
    finally:
        torch.set_default_dtype(dtype)


def test_the_scratch_is_fp32_on_the_backends_device_whatever_the_defaults(model_defaults):
    backend, *_ = _sized()
    backend.init_cuda_graph_state(2, 6)
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in backend._chain_static)
    backend._chain_static = None
    mode = forward_mode("TARGET_VERIFY")
    backend.init_forward_metadata(SimpleNamespace(forward_mode=mode, batch_size=2, req_pool_indices=None,
                                                  seq_lens=None))
    meta = backend._chain_meta
    assert all(t.dtype == torch.float32 and t.device.type == "cpu" for t in (meta.att_out, meta.att_lse))


# ---- metadata ------------------------------------------------------------------------------------
def _batch(cls, bs, n=None, mode=None):
    n = n or bs
    return SimpleNamespace(forward_mode=forward_mode(mode or BACKENDS[cls][0]), batch_size=bs,
                           req_pool_indices=torch.arange(n, dtype=torch.int64),
                           seq_lens=torch.arange(10, 10 + n, dtype=torch.int64))


@pytest.fixture
def parent_calls(monkeypatch):
    """Calls that reached SGLang's own metadata methods, as ``(name, args, kwargs)``."""
    calls = []
    for name in ("init_forward_metadata", "init_forward_metadata_out_graph", "forward_extend"):
        monkeypatch.setattr(PARENT, name, lambda self, *a, _n=name, **k: calls.append((_n, a, k)) or _n)
    return calls


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
def test_capture_reads_the_graphs_static_inputs_and_scratch_and_replay_rebuilds_nothing(parent_calls, cls):
    backend, *_ = _sized(cls)
    backend.init_cuda_graph_state(4, 12)
    fb = _batch(cls, 2, n=4)  # the graph's static buffers, longer than the bucket
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    meta = backend._chain_meta
    assert meta.req_pool_indices.shape == (2,) and meta.req_pool_indices.data_ptr() == fb.req_pool_indices.data_ptr()
    assert meta.seq_lens.shape == (2,) and meta.seq_lens.data_ptr() == fb.seq_lens.data_ptr()
    assert meta.num_kv_splits == backend.num_kv_splits_for(2)
    assert meta.att_out is backend._chain_static[0] and meta.att_lse is backend._chain_static[1]
    backend.init_forward_metadata_out_graph(_batch(cls, 3, n=4))  # a replay
    assert backend._chain_meta is meta and parent_calls == []


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
@pytest.mark.parametrize("in_capture", [False, True])
def test_other_modes_take_sglangs_metadata(parent_calls, cls, in_capture):
    backend, *_ = _sized(cls)
    fb = _batch(cls, 2, mode="EXTEND")
    assert backend.init_forward_metadata_out_graph(fb, in_capture=in_capture) == "init_forward_metadata_out_graph"
    assert backend.init_forward_metadata(fb) == "init_forward_metadata"
    assert parent_calls == [("init_forward_metadata_out_graph", (fb,), {"in_capture": in_capture}),
                            ("init_forward_metadata", (fb,), {})]
    assert backend._chain_meta is not None and backend._chain_meta.num_kv_splits == 1  # the stub's, untouched


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
def test_eager_metadata_uses_the_static_scratch_only_when_it_fits(parent_calls, cls):
    backend, *_ = _sized(cls)
    n_out, n_lse = backend._workspace_for(3)
    fb = _batch(cls, 3)

    def meta_with(static):
        backend._chain_static = static
        backend.init_forward_metadata(fb)
        m = backend._chain_meta
        assert m.req_pool_indices is fb.req_pool_indices and m.seq_lens is fb.seq_lens
        assert m.num_kv_splits == backend.num_kv_splits_for(3)
        return m

    exact = (torch.empty(n_out), torch.empty(n_lse))
    m = meta_with(exact)
    assert m.att_out is exact[0] and m.att_lse is exact[1]
    for short in ((torch.empty(n_out - 1), torch.empty(n_lse)), (torch.empty(n_out), torch.empty(n_lse - 1)),
                  None):
        m = meta_with(short)
        assert (m.att_out.numel(), m.att_lse.numel()) == (n_out, n_lse)
        assert short is None or (m.att_out is not short[0] and m.att_lse is not short[1])
    assert parent_calls == []


# ---- the forward ---------------------------------------------------------------------------------
@pytest.fixture
def launches(monkeypatch):
    """Kernel launches as ``(args, kwargs)`` and KV writes as ``(args, kwargs)``."""
    calls = {"kernel": [], "write": []}
    monkeypatch.setattr(cb.adapter, "kv_write_loc", lambda fb: ("loc of", fb))
    monkeypatch.setattr(cb, "chain_verify_attention_fwd", lambda *a, **k: calls["kernel"].append((a, k)))
    return calls


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
@pytest.mark.parametrize("cap", [0.0, 30.0])
def test_the_kernel_gets_the_layers_views_the_metadata_and_the_cap(launches, cls, cap):
    mode, include_chain, _ = BACKENDS[cls]
    backend, layer, q, k = chain_backend_stub(cls, h=4, kvh=2, d=16, ndt=3, bs=2, logit_cap=cap)
    pool = {i: (torch.zeros(64, 2, 16), torch.zeros(64, 2, 16)) for i in range(3)}
    backend.token_to_kv_pool = SimpleNamespace(get_key_buffer=lambda i: pool[i][0],
                                               get_value_buffer=lambda i: pool[i][1])
    backend._set_kv_buffer = lambda *a, **kw: launches["write"].append((a, kw))
    layer.layer_id = 2
    v = k.clone()
    fb = SimpleNamespace(forward_mode=forward_mode(mode))
    out = backend.forward_extend(q, k, v, layer, fb)
    (args, kw), = launches["kernel"]
    meta = backend._chain_meta
    assert launches["write"] == [((fb, layer, ("loc of", fb), k, v), {})]
    qv, kb, vb, o = args[:4]
    assert qv.shape == (6, 4, 16) and qv.data_ptr() == q.data_ptr()
    assert kb is pool[2][0] and vb is pool[2][1]
    assert o.shape == (6, 4, 16) and out.shape == (6, 64) and o.data_ptr() == out.data_ptr()
    assert args[4:] == (backend.req_to_token, meta.req_pool_indices, meta.seq_lens, backend.chain_shape,
                        meta.num_kv_splits, layer.scaling, meta.att_out, meta.att_lse, cap)
    assert type(args[-1]) is float
    assert kw == {"seq_lens_include_chain": include_chain, "fault": None}


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
def test_no_kv_write_unless_asked(launches, cls):
    backend, layer, q, k = chain_backend_stub(cls)
    backend._set_kv_buffer = lambda *a, **kw: launches["write"].append(a)
    backend.forward_extend(q, k, k.clone(), layer, SimpleNamespace(forward_mode=forward_mode(BACKENDS[cls][0])),
                           save_kv_cache=False)
    assert launches["write"] == [] and len(launches["kernel"]) == 1


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
def test_other_modes_pass_every_argument_to_sglangs_forward(launches, parent_calls, cls):
    backend, layer, q, k = chain_backend_stub(cls)
    v, sinks, mod, aux = k.clone(), object(), object(), object()
    fb = SimpleNamespace(forward_mode=forward_mode("EXTEND"))
    for save in (True, False):
        assert backend.forward_extend(q, k, v, layer, fb, save, sinks, mod, aux) == "forward_extend"
    assert backend.forward_extend(q, k, v, layer, fb) == "forward_extend"
    kws = [dict(save_kv_cache=s, sinks=x, score_mod=m, aux_tensors=a)
           for s, x, m, a in ((True, sinks, mod, aux), (False, sinks, mod, aux), (True, None, None, None))]
    assert parent_calls == [("forward_extend", (q, k, v, layer, fb), kw) for kw in kws]
    assert launches["kernel"] == []


@pytest.mark.parametrize("cls", list(BACKENDS), ids=IDS)
@pytest.mark.parametrize("kw, named", [
    (dict(sinks=torch.zeros(4)), "['attention sinks']"),
    (dict(score_mod=lambda *a: a[0]), "['score_mod']"),
    (dict(sliding_window_size=0), "['sliding window']"),
    (dict(sliding_window_size=1), "['sliding window']"),
    (dict(is_cross_attention=True), "['cross attention']"),
    (dict(k_scale=torch.tensor(0.5), k_scale_float=0.5), "['non-unit KV scales']"),
    (dict(xai_temperature_len=1), "['xai temperature']"),
    (dict(sinks=torch.zeros(4), is_cross_attention=True), "['attention sinks', 'cross attention']"),
    (dict(fresh_kv=False), "no fresh K/V"),
], ids=["sinks", "score-mod", "window-0", "window-1", "cross", "k-scale", "xai-1", "two", "no-kv"])
def test_each_refusal_message(launches, cls, kw, named):
    kw = dict(kw)
    sinks, mod, fresh = kw.pop("sinks", None), kw.pop("score_mod", None), kw.pop("fresh_kv", True)
    backend, layer, q, k = chain_backend_stub(cls, **kw)
    fb = SimpleNamespace(forward_mode=forward_mode(BACKENDS[cls][0]))
    with pytest.raises(RuntimeError) as info:
        backend.forward_extend(q, k, k.clone() if fresh else None, layer, fb, sinks=sinks, score_mod=mod)
    assert str(info.value) == f"chain {cls.role} attention: layer 0 uses {named}; {BACKENDS[cls][2]}"
    assert launches["kernel"] == []


@pytest.mark.parametrize("kw", [dict(xai_temperature_len=None), dict(xai_temperature_len=0),
                                dict(sliding_window_size=None), dict(k_scale=torch.tensor(1.0))],
                         ids=["xai-none", "xai-0", "window-none", "unit-scale"])
def test_layers_without_those_features_are_served(launches, kw):
    backend, layer, q, k = chain_backend_stub(cb.ChainVerifyTritonBackend, **kw)
    backend.forward_extend(q, k, k.clone(), layer, SimpleNamespace(forward_mode=forward_mode("TARGET_VERIFY")))
    assert len(launches["kernel"]) == 1
