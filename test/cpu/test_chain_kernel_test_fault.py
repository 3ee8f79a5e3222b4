"""CPU tier: the chain kernel's test faults, a launch argument (``fault=``) that the chain backends
pass from ``SGLANG_VERIFY_GRAPH_TEST_FAULT`` (parsed by ``env.read_env``).

Without a fault the launcher passes no ``FAULT`` constexpr (the build and launch of the kernel
without the switch) and every fault branch of stage 1 is a ``FAULT == <code>`` test, so that build
takes none; with a fault of its launch, stage 1 gets the fault's code; a fault of the other launch
(a verify fault with ``seq_lens_include_chain``, a ``draft_extend_`` fault without) or an unknown
name is one ``ValueError`` line; an unknown value of the variable is one line naming the variable
and the valid values. The columns each fault reads (``kernel.faults.visible_columns``, the
reference's and the test models' contract) are pinned on hand-computed cases. The kernels are
replaced by recorders (what the kernel computes under each fault is
``test_chain_kernel_interpret.py``; what the backends pass, ``test_chain_backend_test_fault.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from sglang_verify_graph import env  # noqa: E402
from sglang_verify_graph.errors import VerifyGraphConfigError  # noqa: E402
from sglang_verify_graph.kernel import chain_verify_attention as cva  # noqa: E402


class _Recorder:
    """Stands in for a ``triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records kwargs."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(kwargs)


@pytest.fixture
def launch(monkeypatch):
    """``launch(fault, include_chain)`` -> stage 1's keyword arguments of one launch."""

    def run(fault, include_chain=False):
        s1, s2 = _Recorder(), _Recorder()
        monkeypatch.setattr(cva, "_chain_verify_stage1", s1)
        monkeypatch.setattr(cva, "_chain_verify_stage2", s2)
        shape = cva.ChainVerifyShape(4, 2, 16, 16, 3)
        bs, ns = 2, 4
        n_out, n_lse = cva.workspace_numel(shape, bs, ns)
        k = torch.zeros(64, 2, 16)
        q = torch.zeros(bs * 3, 4, 16)
        cva.chain_verify_attention_fwd(
            q, k, k, torch.zeros_like(q), torch.zeros(4, 32, dtype=torch.int32),
            torch.zeros(bs, dtype=torch.int64), torch.tensor([5, 9]), shape, ns, 0.25,
            torch.empty(n_out), torch.empty(n_lse), seq_lens_include_chain=include_chain, fault=fault)
        assert len(s1.calls) == len(s2.calls) == 1
        return s1.calls[0]

    return run


def test_no_fault_passes_no_fault_constexpr(launch):
    shape = cva.ChainVerifyShape(4, 2, 16, 16, 3)
    cfg = launch(None)
    assert "FAULT" not in cfg
    assert cfg == cva.launch_config(shape)[0]  # exactly the launch without the switch
    assert "FAULT" not in launch(None, include_chain=True)


def test_the_unfaulted_build_takes_no_fault_branch():
    """Stage 1 reads ``FAULT`` only in ``if FAULT == <nonzero code>:`` tests (``FAULT`` defaults
    to 0), so the build without a fault has none of the fault code; stage 2 has no ``FAULT``."""
    import ast
    import inspect
    import textwrap

    from sglang_verify_graph.kernel import triton_chain

    def fault_uses(fn):
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn))))
        params = [a for a in tree.body[0].args.args if a.arg == "FAULT"]
        defaults = tree.body[0].args.defaults
        tests = [n.test for n in ast.walk(tree) if isinstance(n, ast.If)]
        guarded = {id(t.left) for t in tests if isinstance(t, ast.Compare) and len(t.ops) == 1
                   and isinstance(t.ops[0], ast.Eq) and isinstance(t.comparators[0], ast.Constant)
                   and t.comparators[0].value != 0}
        uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "FAULT"]
        return params, defaults, uses, guarded

    params, defaults, uses, guarded = fault_uses(triton_chain._chain_verify_stage1)
    assert len(params) == 1 and isinstance(defaults[-1], ast.Constant) and defaults[-1].value == 0
    assert len(uses) == len(set(cva.TEST_FAULTS.values())), "one branch per fault code"
    assert all(id(u) in guarded for u in uses), "FAULT read outside an `if FAULT == <code>:` test"
    assert fault_uses(triton_chain._chain_verify_stage2)[2] == []


@pytest.mark.parametrize("name", sorted(cva.TEST_FAULTS))
def test_a_fault_reaches_stage_one_on_its_launch(launch, name):
    draft_extend = name in cva.DRAFT_EXTEND_TEST_FAULTS
    assert draft_extend == name.startswith("draft_extend_")
    assert launch(name, include_chain=draft_extend)["FAULT"] == cva.TEST_FAULTS[name] > 0


@pytest.mark.parametrize("name", sorted(cva.TEST_FAULTS))
def test_a_fault_on_the_other_launch_is_refused(launch, name):
    draft_extend = name in cva.DRAFT_EXTEND_TEST_FAULTS
    with pytest.raises(ValueError) as e:
        launch(name, include_chain=not draft_extend)
    msg = str(e.value)
    assert "\n" not in msg and repr(name) in msg
    assert ("draft-extend launch only" if draft_extend else "verify launch only") in msg, msg


def test_an_unknown_fault_is_one_line_naming_the_faults(launch):
    with pytest.raises(ValueError) as e:
        launch("causal_plus_two")
    msg = str(e.value)
    assert "\n" not in msg and "'causal_plus_two'" in msg
    assert all(name in msg for name in cva.TEST_FAULTS), msg


def test_the_variable_names_the_kernels_and_the_backends_faults():
    from sglang_verify_graph import chain_backend as cb

    assert set(env.TEST_FAULT_CHOICES) == set(cva.TEST_FAULTS) | {cb.WRONG_LAYER_KV}
    assert set(env.TEST_FAULT_LAUNCHES.values()) == {"verify", "draft-extend"}
    assert {n for n, launch in env.TEST_FAULT_LAUNCHES.items() if launch == "draft-extend"} \
        == cva.DRAFT_EXTEND_TEST_FAULTS
    for name in env.TEST_FAULT_CHOICES:
        assert env.read_env({env.ENV_TEST_FAULT: f" {name} "}).test_fault == name
    for unset in ({}, {env.ENV_TEST_FAULT: ""}, {env.ENV_TEST_FAULT: "  "}):
        assert env.read_env(unset).test_fault is None


def test_the_variables_doc_names_every_fault_under_its_launch():
    """The docstring of ``ENV_TEST_FAULT`` lists the verify faults before ``Draft extend`` and the
    draft-extend faults after it."""
    import ast
    import inspect

    body = ast.parse(inspect.getsource(env)).body
    at = next(i for i, n in enumerate(body) if isinstance(n, ast.Assign)
              and getattr(n.targets[0], "id", "") == "ENV_TEST_FAULT")
    doc = body[at + 1].value.value
    verify, draft_extend = doc.split("Draft extend (")
    for name, launch in env.TEST_FAULT_LAUNCHES.items():
        assert f"``{name}``" in (verify if launch == "verify" else draft_extend), name


def test_an_unknown_value_of_the_variable_is_one_line_naming_it_and_the_values():
    with pytest.raises(VerifyGraphConfigError) as e:
        env.read_env({env.ENV_TEST_FAULT: "causal_plus_two"})
    msg = str(e.value)
    assert "\n" not in msg and env.ENV_TEST_FAULT in msg and "'causal_plus_two'" in msg
    assert all(name in msg for name in env.TEST_FAULT_CHOICES), msg


def test_the_kernel_reads_no_environment():
    """The kernel modules never touch ``os.environ`` (the launch argument is the only switch)."""
    import inspect

    from sglang_verify_graph.kernel import triton_chain

    for mod in (cva, triton_chain):
        src = inspect.getsource(mod)
        assert "os.environ" not in src and "getenv" not in src, mod.__name__


def test_the_reference_refuses_an_unknown_fault_and_one_of_the_other_launch():
    z = torch.zeros(3, 1, 4)
    args = (z, z, z, torch.zeros(1, 8, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
            torch.tensor([2]), 3, 1.0)
    with pytest.raises(ValueError, match="causal_plus_one"):
        cva.chain_verify_attention_ref(*args, fault="bogus")
    with pytest.raises(ValueError, match="verify launch only"):
        cva.chain_verify_attention_ref(*args, fault="causal_plus_one", seq_lens_include_chain=True)
    with pytest.raises(ValueError, match="draft-extend launch only"):
        cva.chain_verify_attention_ref(*args, fault="draft_extend_causal_plus_one")


# prefix, ndt, j, num_kv_splits, fault -> the req_to_token columns draft position j reads
COLUMNS = [
    (5, 3, 0, 4, None, [0, 1, 2, 3, 4, 5]),
    (5, 3, 0, 4, "causal_plus_one", [0, 1, 2, 3, 4, 5, 6]),
    (5, 3, 2, 4, "causal_plus_one", [0, 1, 2, 3, 4, 5, 6, 7]),           # last position: unchanged
    (5, 3, 1, 4, "causal_minus_one", [0, 1, 2, 3, 4, 5]),
    (5, 3, 0, 4, "middle_page_entry", [0, 1, 3, 3, 4, 5]),              # m = 2 reads slot of 3
    (1, 3, 0, 4, "middle_page_entry", [1, 1]),                          # m = 0 reads the chain's first
    (70, 3, 0, 4, "drop_first_split", list(range(37, 71))),             # total 73: 2 splits of 37
    (70, 3, 0, 1, "drop_first_split", list(range(71))),                 # one split: unchanged
    (130, 3, 2, 4, "drop_middle_split", list(range(45)) + list(range(90, 133))),  # 3 splits of 45
    (130, 3, 2, 8, "drop_middle_split", list(range(45)) + list(range(90, 133))),  # eff 3 of 8
    (300, 3, 0, 8, "drop_middle_split", list(range(122)) + list(range(183, 301))),  # eff 5, d 2, 61
    (70, 3, 0, 4, "drop_middle_split", list(range(71))),                # 2 splits: unchanged
    (0, 3, 0, 4, "draft_extend_causal_minus_one", []),                  # padded row: no key (NaN)
    (0, 3, 0, 4, "draft_extend_causal_plus_one", [0, 1]),
    (70, 3, 1, 4, "draft_extend_drop_first_split", list(range(37, 72))),
]


@pytest.mark.parametrize("prefix, ndt, j, splits, fault, want", COLUMNS,
                         ids=[f"{c[4]}-p{c[0]}-j{c[2]}-s{c[3]}" for c in COLUMNS])
def test_each_fault_reads_the_columns_of_its_contract(prefix, ndt, j, splits, fault, want):
    assert cva.visible_columns(prefix, ndt, j, splits, cva.MIN_KEYS_PER_SPLIT, fault) == want


def test_the_reference_reads_a_faults_columns():
    """A middle page entry in the reference: the key of position m = prefix // 2 comes from the
    slot of m + 1 (slots of the page table permuted so a wrong column shows)."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(16, 1, 8, generator=g, dtype=torch.float64)
    q = torch.randn(3, 1, 8, generator=g, dtype=torch.float64)
    r2t = torch.tensor([[9, 3, 7, 1, 12, 5, 2, 11]], dtype=torch.int32)
    args = (q, k, k, r2t, torch.zeros(1, dtype=torch.int64), torch.tensor([5]), 3, 0.5)
    out = cva.chain_verify_attention_ref(*args, fault="middle_page_entry")
    locs = r2t[0, [0, 1, 3, 3, 4, 5]].long()
    want = torch.softmax(k[locs, 0] @ q[0, 0] * 0.5, 0) @ k[locs, 0]
    torch.testing.assert_close(out[0, 0], want)
    assert not torch.allclose(out[0, 0], cva.chain_verify_attention_ref(*args)[0, 0])


def test_a_position_left_no_key_is_nan_in_the_reference():
    """``draft_extend_causal_minus_one`` on a padded draft-extend row (seq_lens 1: prefix 0) leaves
    position 0 no key: NaN, as the kernel's stage 2 gives (0 / 0); the other positions are finite."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(16, 1, 8, generator=g, dtype=torch.float64)
    q = torch.randn(3, 1, 8, generator=g, dtype=torch.float64)
    out = cva.chain_verify_attention_ref(q, k, k, torch.arange(1, 9, dtype=torch.int32)[None],
                                         torch.zeros(1, dtype=torch.int64), torch.tensor([1]), 3, 0.5,
                                         seq_lens_include_chain=True, fault="draft_extend_causal_minus_one")
    assert out[0].isnan().all() and out[1:].isfinite().all()


def test_the_pair_simulator_uses_the_kernels_split_size():
    """The attention pair's simulator models faults of the variable under their names (a subset)."""
    from bench.models import accept_pair

    assert accept_pair.MIN_KEYS_PER_SPLIT == cva.MIN_KEYS_PER_SPLIT
    assert set(accept_pair.FAULTS) <= set(env.TEST_FAULT_CHOICES)
