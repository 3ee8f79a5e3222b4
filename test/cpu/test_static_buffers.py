"""CPU tier: ``VerifyStaticBuffers``, the declaration of the verify graph's static buffers, checked
against SGLang's own ``DecodeInputBuffers`` (built by SGLang's ``create`` on the CPU): the buffers
SGLang makes for a verify bucket pass; a missing, short or wrongly typed input stops the capture
with a ``RuntimeError`` naming the buffer."""

import contextlib
import inspect

import pytest
import torch
from cpu_stubs import chain_backend_stub, chain_config
from sglang.srt.model_executor.runner_utils.buffers import DecodeInputBuffers

from sglang_verify_graph.buffers import PAD_SLOT, VerifyStaticBuffers

INPUTS = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens")


def sglang_buffers(max_bs, ndt, cache_loc_dtype=torch.int64):
    """SGLang's decode/verify input buffers for ``max_bs`` requests x ``ndt`` tokens, as its graph
    runner makes them (``seq_len_fill_value`` 1: SGLang's own fill for padded rows)."""
    params = inspect.signature(DecodeInputBuffers.create).parameters
    dp = "dp_size" if "dp_size" in params else "num_dp_ranks"  # renamed after 0.5.16
    with _one_rank():
        return _create(dp, max_bs, ndt, cache_loc_dtype)


def _one_rank():
    """After 0.5.16 ``create`` reads the process's parallel context (``moe_ep_size``), which a
    CPU test has not published: state one rank for the call. 0.5.16 has no such context."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return contextlib.nullcontext()
    return get_parallel().override(moe_ep_size=1)


def _create(dp, max_bs, ndt, cache_loc_dtype):
    return DecodeInputBuffers.create(
        device=torch.device("cpu"), max_bs=max_bs, max_num_token=max_bs * ndt, hidden_size=8,
        next_token_logits_buffer=torch.zeros(max_bs * ndt, 32), dtype=torch.bfloat16, **{dp: 1},
        pp_size=1, is_encoder_decoder=False, require_mlp_tp_gather=False, seq_len_fill_value=1,
        encoder_len_fill_value=0, num_tokens_per_req=ndt, cache_loc_dtype=cache_loc_dtype,
        enable_mamba_track=False)


def declared(max_bs=4, ndt=4):
    return VerifyStaticBuffers(max_bs=max_bs, num_draft_tokens=ndt, hidden_size=8, num_aux_hidden=3,
                               vocab_size=32, chain_out_numel=64, chain_lse_numel=8)


@pytest.mark.parametrize("live_bs", [4, 8])
def test_sglang_buffers_for_the_bucket_or_larger_pass(live_bs):
    declared(4, 4).check_inputs(sglang_buffers(live_bs, 4))


@pytest.mark.parametrize("name", INPUTS)
def test_a_missing_input_is_named(name):
    b = sglang_buffers(4, 4)
    setattr(b, name, None)
    with pytest.raises(RuntimeError, match=rf"^verify graph: static buffer {name} missing$"):
        declared(4, 4).check_inputs(b)


@pytest.mark.parametrize("name", INPUTS)
def test_a_short_input_is_named_with_its_shape(name):
    b = sglang_buffers(4, 4)
    live = getattr(b, name)
    setattr(b, name, live[: live.shape[0] - 1])
    with pytest.raises(RuntimeError, match=rf"static buffer {name} is \({live.shape[0] - 1},\)"):
        declared(4, 4).check_inputs(b)


def test_the_width_is_part_of_the_contract():
    """Buffers SGLang made for 3 tokens per request are too short for a 4-token verify graph."""
    with pytest.raises(RuntimeError, match=r"static buffer input_ids is \(12,\) torch.int64, expected at least \(16,\)"):
        declared(4, 4).check_inputs(sglang_buffers(4, 3))


def test_int32_cache_locations_are_refused_and_int32_seq_lens_accepted():
    with pytest.raises(RuntimeError, match=r"static buffer out_cache_loc is \(16,\) torch.int32, expected at least "
                                           r"\(16,\) torch.int64"):
        declared(4, 4).check_inputs(sglang_buffers(4, 4, cache_loc_dtype=torch.int32))
    b = sglang_buffers(4, 4)
    b.seq_lens = b.seq_lens.to(torch.int32)  # some backends keep int32 lengths: the kernel takes both
    declared(4, 4).check_inputs(b)
    b.positions = b.positions.to(torch.int32)
    with pytest.raises(RuntimeError, match="static buffer positions is"):
        declared(4, 4).check_inputs(b)


def test_the_declaration_names_every_buffer_its_shape_and_what_padded_rows_hold():
    spec = declared(4, 4)
    assert spec.max_num_tokens == 16
    text = spec.describe()
    for part in ("input_ids[16] pad=token 0", "positions[16] pad=position 0",
                 f"out_cache_loc[16] pad=KV slot {PAD_SLOT} (reserved)", "req_pool_indices[4] pad=page-table row 0",
                 "seq_lens[4] pad=1 (prefix keys)", "next_token_logits[16, 32] pad=computed, discarded",
                 "hidden_states (aux, FULL)[16, 24] pad=computed, discarded", "chain_att_out[64] pad=scratch",
                 "chain_att_lse[8] pad=scratch"):
        assert part in text


@pytest.mark.parametrize("name", ("input_ids", "positions", "out_cache_loc", "req_pool_indices"))
def test_each_int64_input_given_as_int32_is_named(name):
    """Every index input but ``seq_lens`` must be int64 (the graph's kernels index with it)."""
    b = sglang_buffers(4, 4)
    setattr(b, name, getattr(b, name).to(torch.int32))
    with pytest.raises(RuntimeError, match=rf"static buffer {name} is \(\d+,\) torch.int32, expected at "
                                           rf"least \(\d+,\) torch.int64$"):
        declared(4, 4).check_inputs(b)


def test_an_input_the_buffers_object_lacks_is_reported_missing():
    """A ``DecodeInputBuffers`` of another SGLang version without the field at all (not ``None``):
    the same one-line RuntimeError, not an AttributeError."""
    from types import SimpleNamespace

    b = sglang_buffers(4, 4)
    fields = {n: getattr(b, n) for n in INPUTS if n != "req_pool_indices"}
    with pytest.raises(RuntimeError, match=r"^verify graph: static buffer req_pool_indices missing$"):
        declared(4, 4).check_inputs(SimpleNamespace(**fields))


def test_the_declared_input_dtypes_are_the_ones_sglang_allocates():
    """The declaration states SGLang's own buffers: each input's declared dtype is the dtype
    ``DecodeInputBuffers.create`` gives it (all int64 on the default cache-location dtype)."""
    b = sglang_buffers(4, 4)
    specs = {s.name: s for s in declared(4, 4).declare()}
    for name in INPUTS:
        assert specs[name].dtype == getattr(b, name).dtype == torch.int64, name


def test_the_declared_scratch_is_what_the_chain_backend_allocates():
    """The runner declares ``chain_att_out`` / ``chain_att_lse`` from the chain backend's
    ``chain_workspace_numel``: the declaration's sizes and dtypes are those of the tensors
    ``init_cuda_graph_state`` allocates for the largest bucket (fp32 partials)."""
    from sglang_verify_graph import chain_backend as cb

    backend, _, _, _ = chain_backend_stub(cb.ChainVerifyTritonBackend)
    backend.device, backend.device_core_count, backend.verify_cfg = "cpu", 132, chain_config()
    backend.init_cuda_graph_state(max_bs=8, max_num_tokens=8 * 3)
    n_out, n_lse = backend.chain_workspace_numel
    spec = VerifyStaticBuffers(max_bs=8, num_draft_tokens=3, hidden_size=8, num_aux_hidden=3,
                               vocab_size=32, chain_out_numel=n_out, chain_lse_numel=n_lse)
    specs = {s.name: s for s in spec.declare()}
    for name, live in zip(("chain_att_out", "chain_att_lse"), backend._chain_static):
        assert specs[name].shape == tuple(live.shape) and specs[name].dtype == live.dtype, name
    assert specs["chain_att_out"].dtype == torch.float32 and n_out > 0 and n_lse > 0


def test_the_description_is_one_entry_per_buffer_in_declaration_order():
    spec = declared(4, 4)
    entries = spec.describe().split("; ")
    assert [e.split("[")[0] for e in entries] == [s.name for s in spec.declare()]
    assert len(entries) == 9
