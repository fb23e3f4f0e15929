"""The owner scheme's parts, on one device: units, stacks, the packing of parts, spec rules, and
the reading of communication from compiled programs.

Each check compares with NumPy slicing written here or with numbers worked out by hand. The
scheme on real meshes (8 simulated devices and 2 processes) is in `test_owners_mesh.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

import modopt
from modopt.sharding._cost import compiled_cost
from modopt.sharding._owners import (
    LeafUnits,
    UnitMap,
    UnitStacks,
    _pack,
    _unpack,
    matrix_map,
    owner_axes,
    run_per_unit,
    whole_map,
)

MESH = AbstractMesh((2, 4), ("data", "model"))


def arange(shape):
    return jnp.arange(int(np.prod(shape)), dtype=jnp.float32).reshape(shape)


def test_matrix_units_are_the_weight_slices():
    """A (3, 4, 5) weight with batch axis 1, rows axis 2 and columns axis 0: unit b is
    `x[:, b, :].T`; with `swap`, its transpose."""
    x = arange((3, 4, 5))
    units = matrix_map(x.shape, (1,), (2,), (0,))
    stacked = np.asarray(units.to_units(x))
    assert stacked.shape == (4, 5, 3) and units.count == 4 and units.unit_shape == (5, 3)
    for b in range(4):
        np.testing.assert_array_equal(stacked[b], np.asarray(x)[:, b, :].T)
    np.testing.assert_array_equal(units.from_units(units.to_units(x)), x)
    swapped = units._replace(swap=True)
    assert swapped.unit_shape == (3, 5)
    np.testing.assert_array_equal(np.asarray(swapped.to_units(x))[2], np.asarray(x)[:, 2, :])
    np.testing.assert_array_equal(swapped.from_units(swapped.to_units(x)), x)


def test_blocks_are_padded_slices_in_row_major_order():
    """A (10, 7) matrix in blocks of 4: a 3 x 2 grid of (4, 4) blocks, zero-padded at the edges,
    in row-major order of the grid (Shampoo's blocking)."""
    x = arange((10, 7))
    units = UnitMap((10, 7), (0, 1), (1, 1), (3, 2), (4, 4))
    stacked = np.asarray(units.to_units(x))
    padded = np.zeros((12, 8), np.float32)
    padded[:10, :7] = np.asarray(x)
    expected = [padded[4 * i : 4 * i + 4, 4 * j : 4 * j + 4] for i in range(3) for j in range(2)]
    np.testing.assert_array_equal(stacked, np.stack(expected))
    np.testing.assert_array_equal(units.from_units(units.to_units(x)), x)


def test_whole_units_merge_and_permute():
    """A channels-last (2, 3, 3, 5) tensor put channels first and its last three axes merged:
    one (2, 45) unit equal to NumPy's transpose and reshape."""
    x = arange((2, 3, 3, 5))
    units = whole_map(x.shape, ((0,), (1, 2, 3)), perm=(0, 3, 1, 2))
    np.testing.assert_array_equal(units.to_units(x)[0], np.asarray(x).transpose(0, 3, 1, 2).reshape(2, 45))
    np.testing.assert_array_equal(units.from_units(units.to_units(x)), x)
    scalar = whole_map(())
    assert scalar.to_units(jnp.float32(3.0)).shape == (1,) and float(scalar.from_units(jnp.ones((1,)))) == 1.0


@pytest.mark.parametrize(
    "units, spec, expected",
    [
        (matrix_map((8, 16), (), (0,), (1,)), P("model", None), (("model",), ())),  # rows split
        (matrix_map((8, 16), (), (0,), (1,), swap=True), P("model", None), ((), ("model",))),  # transposed
        (matrix_map((8, 16), (), (0,), (1,)), P(("data", "model"), None), (("data", "model"), ())),
        (matrix_map((4, 8, 16), (0,), (1,), (2,)), P("data"), None),  # the stack axis is split
        (whole_map((8, 2, 16), ((0, 1), (2,))), P("model"), (("model",), ())),  # leads its merge
        (whole_map((2, 8, 16), ((0, 1), (2,))), P(None, "model"), None),  # inside its merge
        (UnitMap((16, 8), (0, 1), (1, 1), (4, 1), (4, 8)), P(None, "model"), ((), ("model",))),
        (UnitMap((16, 8), (0, 1), (1, 1), (4, 1), (4, 8)), P("model", None), None),  # across blocks
    ],
)
def test_unit_axes_follow_the_leaf_split(units, spec, expected):
    assert units.unit_axes(spec, MESH) == expected


@pytest.mark.parametrize("layout", [(("model",), ()), ((), ("model",)), (("data",), ("model",)), (("model",), ("data",))])
def test_packing_puts_each_device_part_in_its_slot(layout):
    """Packed `(n, parts, part)`: part `p` (parts numbered in mesh order, "data" major) is the
    block of the unit that device `p` holds when the unit's dimensions are split as `layout`;
    unpacking inverts it."""
    units = arange((3, 8, 12))
    packed = np.asarray(_pack(units, layout, MESH))
    ways = [int(np.prod([MESH.shape[a] for a in names])) for names in layout]
    assert packed.shape == (3, ways[0] * ways[1], 96 // (ways[0] * ways[1]))
    for data in range(2):
        for model in range(4):
            coordinate = {"data": data, "model": model}
            part = (data * 4 + model) if ways[0] * ways[1] == 8 else model

            def block(size, names):
                if not names:
                    return slice(None)
                step = size // MESH.shape[names[0]]
                return slice(coordinate[names[0]] * step, (coordinate[names[0]] + 1) * step)

            expected = np.asarray(units)[:, block(8, layout[0]), block(12, layout[1])].reshape(3, -1)
            np.testing.assert_array_equal(packed[:, part], expected)
    np.testing.assert_array_equal(_unpack(jnp.asarray(packed), layout, (8, 12), MESH), units)


def test_owner_axes_take_the_largest_divisor():
    assert owner_axes(16, MESH) == ("data", "model")
    assert owner_axes(4, MESH) == ("model",)
    assert owner_axes(6, MESH) == ("data",)
    assert owner_axes(3, MESH) == ()
    assert modopt.sharding.owner_spec(8, MESH) == P(("data", "model"))
    fine = AbstractMesh((2, 2, 2), ("a", "b", "c"))  # the same 8 devices, finer axes
    assert owner_axes(2, AbstractMesh((8,), ("fsdp",))) == () and owner_axes(2, fine) == ("a",)


def test_stacks_group_by_kind_in_order_of_first_leaf():
    stacks = UnitStacks(["a", None, "b", "a"], [2, 0, 1, 3])
    assert stacks.kinds == ("a", "b") and stacks.members == ((0, 3), (2,)) and stacks.size(0) == 5
    per_leaf = [arange((2, 2)), None, arange((1, 2)) + 100, arange((3, 2)) + 10]
    stacked = stacks.stack(per_leaf)
    np.testing.assert_array_equal(stacked[0], np.concatenate([per_leaf[0], per_leaf[3]]))
    back = stacks.unstack(stacked)
    assert back[1] is None
    for a, b in zip(back, per_leaf):
        if b is not None:
            np.testing.assert_array_equal(a, b)


def test_without_a_mesh_each_leaf_is_its_own_piece():
    """Without a mesh the work sees each leaf's units with its rows of the stack's state, and the
    new state is stacked back in order."""
    x, y, z = arange((4, 6)), arange((4, 6)) + 1, arange((3, 3))
    leaves = [LeafUnits((v,), whole_map(v.shape)) for v in (x, y, z)]
    stacks = UnitStacks([v.shape for v in (x, y, z)], [1, 1, 1])
    state = [jnp.arange(2.0), jnp.asarray([7.0])]  # one number per unit
    seen = []

    def work(kinds, pieces, states):
        seen.append([(kind, piece[0].shape, s.tolist()) for kind, piece, s in zip(kinds, pieces, states)])
        return [(2 * piece[0],) for piece in pieces], [s + 1 for s in states]

    outs, new = run_per_unit(work, stacks, leaves, state)
    assert seen == [[((4, 6), (1, 4, 6), [0.0]), ((4, 6), (1, 4, 6), [1.0]), ((3, 3), (1, 3, 3), [7.0])]]
    for (out,), v in zip(outs, (x, y, z)):
        np.testing.assert_array_equal(out, 2 * v)
    np.testing.assert_array_equal(new[0], [1.0, 2.0])
    np.testing.assert_array_equal(new[1], [8.0])


def test_stacked_without_a_mesh_each_stack_is_one_piece():
    """With `stacked`, the work sees each stack's units concatenated in the leaves' order, with the
    stack's state (its padding rows cut off, then zero again), and each leaf gets its own rows
    of the outputs back."""
    x, y, z = arange((4, 6)), arange((4, 6)) + 1, arange((3, 3))
    leaves = [LeafUnits((v,), whole_map(v.shape)) for v in (x, y, z)]
    stacks = UnitStacks([v.shape for v in (x, y, z)], [1, 1, 1])
    state = [jnp.asarray([0.0, 1.0, 0.0]), jnp.asarray([7.0])]  # the first stored padded (3 rows)
    seen = []

    def work(kinds, pieces, states):
        seen.append([(kind, piece[0].shape, s.tolist()) for kind, piece, s in zip(kinds, pieces, states)])
        return [(2 * piece[0],) for piece in pieces], [s + 1 for s in states]

    outs, new = run_per_unit(work, stacks, leaves, state, stacked=True)
    assert seen == [[((4, 6), (2, 4, 6), [0.0, 1.0]), ((3, 3), (1, 3, 3), [7.0])]]
    for (out,), v in zip(outs, (x, y, z)):
        np.testing.assert_array_equal(out, 2 * v)
    np.testing.assert_array_equal(new[0], [1.0, 2.0, 0.0])
    np.testing.assert_array_equal(new[1], [8.0])


def test_muon_orthogonalizes_each_shape_in_one_batched_program():
    """Without a mesh, Muon's Newton-Schulz runs once per shape of matrix, batched over the
    matrices of that shape (12 matrices of 2 shapes: one loop of 3 products per shape, not one
    per matrix), and gives each matrix what orthogonalizing it alone gives."""
    from modopt.transforms._newton_schulz import as_ns_coeffs, orthogonalize, orthogonalize_leaves

    shapes = [(8, 8), (8, 8), (8, 24)] * 4
    leaves = [jax.random.normal(k, s) for k, s in zip(jax.random.split(jax.random.key(0), len(shapes)), shapes)]
    axes = [((), (1,), (0,))] * len(leaves)
    coeffs = as_ns_coeffs("standard")
    jaxpr = jax.make_jaxpr(lambda ls: orthogonalize_leaves(ls, axes, coeffs, 5, "frobenius", 1e-8))(leaves).jaxpr
    products = [eqn for name, eqn in _equations(jaxpr) if name == "dot_general"]
    assert len(products) == 2 * 3, len(products)
    together = orthogonalize_leaves(leaves, axes, coeffs, 5, "frobenius", 1e-8)
    for x, a, out in zip(leaves, axes, together):
        np.testing.assert_allclose(out, orthogonalize(x, a, coeffs, 5, "frobenius", 1e-8), rtol=0, atol=1e-5)


def _equations(jaxpr) -> list:
    """`(primitive name, equation)` of every equation in `jaxpr` and the jaxprs inside it."""
    found = []
    for eqn in jaxpr.eqns:
        found.append((eqn.primitive.name, eqn))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                sub = getattr(sub, "jaxpr", sub)
                if isinstance(sub, jax.extend.core.Jaxpr):
                    found += _equations(sub)
    return found


# Programs written by hand in XLA's text format: each collective's bytes are worked out below.
_HLO = """HloModule step, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%body (p: (s32[], f32[16,64])) -> (s32[], f32[16,64]) {
  %p = (s32[], f32[16,64]{1,0}) parameter(0)
  %x = f32[16,64]{1,0} get-tuple-element(%p), index=1
  %gathered = f32[128,64]{1,0} all-gather(%x), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %t = (s32[], f32[16,64]{1,0}) tuple(%i, %x)
}

%cond (p: (s32[], f32[16,64])) -> pred[] {
  %p = (s32[], f32[16,64]{1,0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

%cheap (q: f32[16,64]) -> f32[16,64] {
  ROOT %q = f32[16,64]{1,0} parameter(0)
}

%costly (q: f32[16,64]) -> f32[16,64] {
  %q = f32[16,64]{1,0} parameter(0)
  ROOT %r = f32[16,64]{1,0} all-reduce(%q), channel_id=2, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
}

ENTRY %main (x: f32[16,64], c: s32[]) -> f32[16,64] {
  %x = f32[16,64]{1,0} parameter(0)
  %c = s32[] parameter(1)
  %init = (s32[], f32[16,64]{1,0}) tuple(%c, %x)
  %loop = (s32[], f32[16,64]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %moved = (f32[2,4,64]{2,1,0}, f32[2,4,64]{2,1,0}) all-to-all(%x, %x), channel_id=3, replica_groups=mesh['a'=2,'b'=4] {'b'}, dimensions={0}
  %started = (f32[16,64]{1,0}, f32[64,64]{1,0}) all-gather-start(%x), channel_id=4, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %done = f32[64,64]{1,0} all-gather-done(%started)
  %swapped = f32[16,64]{1,0} collective-permute(%x), channel_id=5, source_target_pairs={{0,1},{1,0}}
  %branch = s32[] constant(0)
  ROOT %out = f32[16,64]{1,0} conditional(%branch, %x, %x), branch_computations={%cheap, %costly}
}
"""


def test_collective_bytes_read_from_a_program():
    """By hand: the loop's all-gather of a 128x64 float32 array over 8 devices receives 7/8 of
    32768 bytes, 5 times; the all-to-all of two 2x4x64 arrays over the 4 devices of axis 'b'
    receives 3/4 of 4096 bytes; the async all-gather to 64x64 over groups of 4 receives 3/4 of
    16384; the permute receives its 4096 bytes; the costly branch's all-reduce of 4096 bytes over
    pairs receives 2 * 1/2 of them."""
    cost = compiled_cost(_HLO)
    loop = 5 * 32768 * 7 / 8
    rest = 4096 * 3 / 4 + 16384 * 3 / 4 + 4096
    assert cost.received_bytes == pytest.approx(loop + rest)
    assert cost.received_bytes_costliest == pytest.approx(loop + rest + 4096)
    assert cost.by_kind() == pytest.approx(
        {"all-gather": loop + 16384 * 3 / 4, "all-to-all": 4096 * 3 / 4, "collective-permute": 4096}
    )
    assert cost.unknown_trip_counts == 0
    assert {c.group_size for c in cost.collectives} == {8, 4, 8}


def test_compiled_cost_of_a_program_without_collectives():
    compiled = jax.jit(lambda x: (x @ x.T).sum()).lower(jnp.ones((8, 8))).compile()
    cost = compiled_cost(compiled)
    assert cost.received_bytes == 0 and cost.collectives == ()
    assert cost.flops >= 2 * 8 * 8 * 8  # the product, at least


def test_decompositions_counted_by_their_textbook_operation_counts():
    """XLA counts nothing in a LAPACK call; `compiled_cost` counts the decompositions from their
    shapes (Golub and Van Loan's counts): a batch of 3 eigendecompositions of 16 x 16 (9 n^3
    each); the QR of a 20 x 12 matrix, factored and its Q formed (2 m n^2 - 2 n^3 / 3 each); a
    triangular solve of a 6 x 6 factor with 5 right-hand sides (n^2 k), in a loop of 4 trips;
    an eigendecomposition in one branch of a conditional, on the costliest path only."""

    def program(a, b, q, t, s, p):
        solved = jax.lax.fori_loop(0, 4, lambda i, x: jax.lax.linalg.triangular_solve(t, x, left_side=True, lower=True), s)
        refreshed = jax.lax.cond(p, lambda m: jnp.linalg.eigh(m)[1], lambda m: m, b)
        return jnp.linalg.eigh(a)[1], jnp.linalg.qr(q)[0], solved, refreshed

    args = (jnp.ones((3, 16, 16)), jnp.eye(10), jnp.ones((20, 12)), jnp.eye(6), jnp.ones((6, 5)), True)
    cost = compiled_cost(jax.jit(program).lower(*args).compile())
    plain = 3 * 9 * 16**3 + 2 * (2 * 20 * 12**2 - 2 * 12**3 / 3) + 4 * 6**2 * 5
    assert cost.decomposition_flops == pytest.approx(plain)
    assert cost.decomposition_flops_costliest == pytest.approx(plain + 9 * 10**3)
    assert compiled_cost(jax.jit(lambda x: x @ x).lower(jnp.ones((4, 4))).compile()).decomposition_flops == 0


def test_elementwise_stacks_split_inside_their_units_where_padding_would_double_them():
    """`spread_spec`: a stack of elementwise state is split along its largest unit dimension
    that the device count divides, over every mesh axis, where padding it to the device count
    would give it at least as many padding units as units; otherwise it stays on its owners."""
    line = AbstractMesh((8,), ("fsdp",))
    spread = modopt.sharding.spread_spec
    assert spread(2, (64, 128), line) == P(None, None, "fsdp")  # padded to 8: 6 padding units
    assert spread(4, (16, 8), line) == P(None, "fsdp", None)  # 4 padding units: as many as units
    assert spread(5, (64, 128), line) is None and spread(9, (64, 128), line) is None  # 3 and 7 padding units
    assert spread(2, (12, 6), line) is None  # no dimension splits over 8
    assert spread(1, (64,), MESH) == P(None, ("data", "model"))
    assert spread(2, (64, 128), None) is None


def test_soap_state_of_a_short_stack_is_split_inside_its_units():
    """SOAP on a transformer's shapes, 8 devices: the embedding and the head (2 units of one kind)
    keep their moments unpadded and split over every device; the other stacks are padded to 8 on
    their owners. The most state one device holds is then within 1.15 of an even split of the
    state without padding (it was 1.18 with the moments padded too)."""
    from modopt._state.signature import ModelSignature
    from modopt.sharding._shardings import derive_layout

    width = 64
    layer = {"wq": (width, width), "wk": (width, width), "wv": (width, width), "wo": (width, width)}
    layer |= {"up": (width, 4 * width), "down": (4 * width, width), "ln": (width,)}
    shapes = {"embed": (2 * width, width), "layers": [layer] * 4, "head": (width, 2 * width)}
    is_shape = lambda x: isinstance(x, tuple) and all(isinstance(d, int) for d in x)  # noqa: E731
    params = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes, is_leaf=is_shape)
    tx = modopt.scale_by_soap()
    state = jax.eval_shape(tx.init, params)
    for mesh, specs, zero_axis in [
        (AbstractMesh((8,), ("fsdp",)), jax.tree_util.tree_map(lambda _: P("fsdp"), params), None),
        (MESH, jax.tree_util.tree_map(lambda p: P() if len(p.shape) == 1 else P(None, "model"), params), "data"),
    ]:
        layout = derive_layout(tx, ModelSignature(params, params), state, specs, mesh, zero_axis, pad_owned=True)
        leaves = jax.tree_util.tree_leaves(state)
        stored = [
            jax.ShapeDtypeStruct(x.shape if n is None else (n, *x.shape[1:]), x.dtype) for x, n in zip(leaves, layout.lengths)
        ]
        placed = jax.tree_util.tree_leaves(layout.state)
        short = next(i for i, x in enumerate(state.mu) if x.shape == (2, width, 2 * width))
        axes = tuple(a for a in mesh.axis_names if mesh.shape[a] > 1)
        assert layout.state.mu[short].spec == P(None, None, axes[0] if len(axes) == 1 else axes)
        assert all(x.shape[0] == 2 for x in (state.mu[short], state.nu[short]))  # unpadded
        assert all(n is None or n % 8 == 0 for n in layout.lengths)
        total = sum(x.size * x.dtype.itemsize for x in leaves)
        most = bytes_per_device_of(stored, placed, mesh)
        assert most / (total / 8) <= 1.15, most / (total / 8)


def bytes_per_device_of(leaves, shardings, mesh):
    """The bytes one device holds of arrays of `leaves`' shapes laid out as `shardings` (every
    split even): each array's bytes over the product of the sizes of the axes it is split over."""
    held = 0
    for x, s in zip(leaves, shardings):
        names = [n for entry in s.spec if entry is not None for n in ((entry,) if isinstance(entry, str) else entry)]
        held += x.size * x.dtype.itemsize // int(np.prod([mesh.shape[n] for n in names]))
    return held


def test_without_a_mesh_state_keeps_the_lengths_it_is_stored_with():
    """A stack's state of which one leaf is stored at the stack's own length (elementwise state
    split inside its units) and one padded with zero units: the work sees each leaf's rows, and
    each new leaf comes back at its stored length, its padding zero."""
    x, y = arange((4, 6)), arange((4, 6)) + 1
    leaves = [LeafUnits((v,), whole_map(v.shape)) for v in (x, y)]
    stacks = UnitStacks([(4, 6), (4, 6)], [1, 1])
    moments, padded_rows = jnp.asarray([1.0, 2.0]), jnp.asarray([10.0, 20.0, 0.0, 0.0])

    def work(kinds, pieces, states):
        return [(piece[0],) for piece in pieces], [(m + 1, s * 2) for m, s in states]

    _, new = run_per_unit(work, stacks, leaves, [(moments, padded_rows)])
    np.testing.assert_array_equal(new[0][0], [2.0, 3.0])
    np.testing.assert_array_equal(new[0][1], [20.0, 40.0, 0.0, 0.0])


def _primitives(jaxpr, inside=()) -> list[tuple[str, tuple[str, ...]]]:
    """Every primitive of a jaxpr and its nested jaxprs, with the primitives it is nested in."""
    found = []
    for eqn in jaxpr.eqns:
        found.append((eqn.primitive.name, inside))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                sub = getattr(sub, "jaxpr", sub)
                if isinstance(sub, jax.extend.core.Jaxpr):
                    found += _primitives(sub, (*inside, eqn.primitive.name))
    return found


def test_galore_refreshes_its_projections_on_owners():
    """On a mesh, every SVD of GaLore's refresh runs inside the owner scheme's `shard_map` (one
    device per matrix), and only in the refresh branch of the step's `cond`; without a mesh,
    outside any `shard_map`."""
    from modopt.sharding._owners import owner_mesh

    params = {"w": jnp.ones((16, 8)), "v": jnp.ones((4, 12)), "b": jnp.ones(8)}
    tx = modopt.contrib.scale_by_galore(rank=4)
    state = tx.init(params)
    with owner_mesh(AbstractMesh((8,), ("fsdp",))):
        on_mesh = _primitives(jax.make_jaxpr(tx.update)(params, state, params).jaxpr)
    svds = [inside for name, inside in on_mesh if name == "svd"]
    assert svds and all("shard_map" in inside and "cond" in inside for inside in svds), svds
    alone = _primitives(jax.make_jaxpr(tx.update)(params, state, params).jaxpr)
    svds = [inside for name, inside in alone if name == "svd"]
    assert len(svds) == 2 and not any("shard_map" in inside for inside in svds), svds


def test_galore_stacks_a_weight_with_its_transpose():
    """On a mesh of 2, a (12, 5) and two (5, 12) weights share one stack of the owner scheme
    (short side first: both projections are 12 x rank), whose units each device runs one by one,
    each through the SVD of its own orientation (a branch each); the (7, 7) one is a stack of its
    own, one unit per device. Their numbers on 8 devices: `test_sharded.py`."""
    from modopt.sharding._owners import owner_mesh

    params = {"tall": jnp.ones((12, 5)), "wide": jnp.ones((5, 12)), "wide2": jnp.ones((5, 12)), "square": jnp.ones((7, 7))}
    tx = modopt.contrib.scale_by_galore(rank=3)
    state = tx.init(params)
    with owner_mesh(AbstractMesh((2,), ("fsdp",))):
        found = _primitives(jax.make_jaxpr(tx.update)(params, state, params).jaxpr)
    svds = [inside for name, inside in found if name == "svd"]
    innermost = [[name for name in inside if name != "jit"][-1] for inside in svds]  # `jnp.linalg.svd` is a jit
    assert len(svds) == 3 and all("shard_map" in inside for inside in svds) and innermost == ["cond"] * 3, svds
    assert sum("scan" in inside for inside in svds) == 2, svds


def test_units_with_a_conditional_run_one_by_one_when_asked():
    """Batched, a conditional on each unit runs every branch (`select_n`); `sequential` runs the
    units one after the other, each through its one branch: the same numbers."""
    from modopt.sharding._owners import per_unit

    def fn(x, code):
        return jax.lax.switch(code, [lambda: jnp.zeros(2), lambda: jnp.sin(x), lambda: jnp.cos(x)])

    x, codes = arange((3, 2)), jnp.array([0, 1, 2])
    batched = _primitives(jax.make_jaxpr(lambda x, c: per_unit(fn, 3, x, c))(x, codes).jaxpr)
    one_by_one = _primitives(jax.make_jaxpr(lambda x, c: per_unit(fn, 3, x, c, sequential=True))(x, codes).jaxpr)
    assert "select_n" in [name for name, _ in batched] and "cond" not in [name for name, _ in batched]
    assert ("cond", ("scan",)) in one_by_one
    expected = np.stack([np.zeros(2), np.sin(np.asarray(x[1])), np.cos(np.asarray(x[2]))])
    np.testing.assert_allclose(per_unit(fn, 3, x, codes, sequential=True), expected, rtol=1e-6)
    np.testing.assert_allclose(per_unit(fn, 3, x, codes), expected, rtol=1e-6)
