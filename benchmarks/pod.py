"""Matrix optimizers on a pod: communication, repeated work, state and time per device.

Run `python benchmarks/pod.py` (writes benchmarks/pod.txt and .json; `--size smoke` for a
quick look, which writes nothing unless `--out`). It sets up 8 simulated CPU devices itself.

For each optimizer and each of two layouts of a transformer's parameters on 8 devices:

- "fsdp": a mesh `(8,)` named "fsdp"; every parameter split along its first axis.
- "fsdp 2x2x2": the same on a mesh `(2, 2, 2)` of the 8 devices, each parameter split over all
  three axes: a stack of 2 or 4 units of a kind can split over 2 or 4 devices (on one axis of
  8 it is held whole by every device; see `modopt.sharding.owner_axes`).
- "tp+zero1": a mesh `(2, 4)` named ("data", "model"); Megatron's tensor parallelism (the
  query, key, value and first MLP matrices split by columns over "model", the attention output
  and second MLP matrices by rows, the embedding and the head by the vocabulary), norms
  replicated; the optimizer state also split over "data" (ZeRO-1, `zero_axis="data"`).

it compiles the optimizer step (`optimizer.step(params, grads)`, jitted, donated) and reads
from the compiled program (`modopt.sharding.compiled_cost`):

- communication: the bytes each device receives through collectives in one step, in units of
  P/N (one device's share of the float32 parameters): on a plain step, on a refresh step
  (each conditional's costliest branch), and amortized over the optimizer's default refresh
  period;
- repeated work: the step's floating-point operations per device, times N, over those of the
  same step compiled for one device (1.0: the work is split, nothing is computed twice); XLA
  counts no operations in library calls, so the decompositions LAPACK runs (SOAP's
  eigenvectors and QR, GaLore's SVD) are a ratio of their own, "decomp", taken on a refresh
  step (`compiled_cost`'s `decomposition_flops_costliest`; "-" for a step without any);
- state: the most optimizer-state bytes on one device over (all state bytes / N);
- compile time of the sharded step, and the CPU time of the optimizer step and of a full
  training step (forward, backward, optimizer) on the simulated mesh, each against AdamW's.
  These are CPU figures: 8 simulated devices share this machine's cores, so they show what
  the step does, not what a pod's chips would take.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import modopt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICES = 8
SIZES = {
    "full": {"layers": 4, "width": 128, "vocab": 256, "batch": 16, "context": 64, "repeats": 5},
    "smoke": {"layers": 4, "width": 64, "vocab": 128, "batch": 8, "context": 16, "repeats": 1},
}


def _muon_dims(params):
    """Muon's matrices: the attention and MLP weights; the embedding, the head and the norms go
    to its AdamW, as the Muon papers prescribe."""
    dims = modopt.contrib.MuonDimensionNumbers()
    return {
        "embed": None,
        "head": None,
        "ln_f": None,
        "layers": [{name: (None if name.startswith("ln") else dims) for name in layer} for layer in params["layers"]],
    }


# Each optimizer with its defaults (a learning rate where it has none), and how often it
# refreshes its preconditioner by default (for the amortized communication).
OPTIMIZERS = {
    "adamw": (lambda: modopt.adamw(1e-3, weight_decay=0.1), 1),
    "muon": (lambda: modopt.contrib.muon(0.02, muon_weight_dimension_numbers=_muon_dims), 1),
    "normuon": (lambda: modopt.normuon(0.02, muon_weight_dimension_numbers=_muon_dims), 1),
    "adamuon": (lambda: modopt.adamuon(0.02, muon_weight_dimension_numbers=_muon_dims), 1),
    "shampoo": (lambda: modopt.shampoo(1e-3), 1),
    "soap": (lambda: modopt.soap(3e-3), 10),
    "kron": (lambda: modopt.kron(), 1),
    # GaLore (rank 16 of 128) refreshes its projections by SVD every 200 steps.
    "galore": (lambda: modopt.contrib.galore(1e-3, rank=16, weight_decay=0.1), 200),
}
MATRIX_OPTIMIZERS = [name for name in OPTIMIZERS if name != "adamw"]

# The goals: bytes received per device in units of P/N, and the two ratios.
GOALS = {
    "communication": {
        "fsdp": {"muon": 3, "normuon": 3, "adamuon": 3, "shampoo": 4, "soap": 4, "kron": 4, "galore": 4},
        "fsdp 2x2x2": {"muon": 3, "normuon": 3, "adamuon": 3, "shampoo": 4, "soap": 4, "kron": 4, "galore": 4},
        "tp+zero1": {"muon": 4, "normuon": 4, "adamuon": 4, "shampoo": 5, "soap": 5, "kron": 5, "galore": 5},
    },
    "refresh": 6,
    "repeated work": 1.25,
    "state": 1.15,
}


def model_shapes(layers: int, width: int, vocab: int) -> dict:
    """A decoder-only transformer's parameters (weights used as `x @ W`, (in, out))."""
    layer = {
        "ln1": (width,),
        "wq": (width, width),
        "wk": (width, width),
        "wv": (width, width),
        "wo": (width, width),
        "ln2": (width,),
        "w_up": (width, 4 * width),
        "w_down": (4 * width, width),
    }
    return {"embed": (vocab, width), "layers": [dict(layer) for _ in range(layers)], "ln_f": (width,), "head": (width, vocab)}


def is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(d, int) for d in x)


def make_params(shapes: dict, seed: int) -> dict:
    """Host (NumPy) float32 arrays: norms' scales 1, matrices normal / sqrt(fan_in), drawn from
    `jax.random.key(seed)`."""
    leaves, treedef = jax.tree_util.tree_flatten(shapes, is_leaf=is_shape)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return treedef.unflatten(
        [np.ones(s, np.float32) if len(s) == 1 else np.asarray(jax.random.normal(k, s) / math.sqrt(s[0])) for k, s in zip(keys, leaves)]
    )


_TP_COLUMNS = {"wq", "wk", "wv", "w_up"}  # split by output columns over "model"; wo, w_down by rows


def layouts() -> dict:
    """name -> (mesh, a function from the shapes' tree to their specs, zero_axis, the batch's spec)."""
    fsdp = jax.make_mesh((DEVICES,), ("fsdp",), axis_types=(AxisType.Auto,))
    tp = jax.make_mesh((2, DEVICES // 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

    def fsdp_specs(shapes):
        return jax.tree_util.tree_map(lambda s: P("fsdp"), shapes, is_leaf=is_shape)

    def tp_specs(shapes):
        def layer(entries):
            return {
                name: P() if name.startswith("ln") else P(None, "model") if name in _TP_COLUMNS else P("model", None)
                for name in entries
            }

        return {
            "embed": P("model", None),
            "layers": [layer(entries) for entries in shapes["layers"]],
            "ln_f": P(),
            "head": P(None, "model"),
        }

    # The same FSDP layout on a mesh whose axes factor the 8 devices: a stack of units that 8
    # does not divide (2 or 4 of a kind) can still split over 2 or 4 of them.
    fine = jax.make_mesh((2, 2, DEVICES // 4), FINE_AXES, axis_types=(AxisType.Auto,) * 3)

    def fine_specs(shapes):
        return jax.tree_util.tree_map(lambda s: P(FINE_AXES), shapes, is_leaf=is_shape)

    return {
        "fsdp": (fsdp, fsdp_specs, None, P("fsdp")),
        "fsdp 2x2x2": (fine, fine_specs, None, P(FINE_AXES)),
        "tp+zero1": (tp, tp_specs, "data", P("data")),
    }


FINE_AXES = ("fsdp_a", "fsdp_b", "fsdp_c")


def forward_loss(params: dict, tokens: jax.Array, heads: int = 4) -> jax.Array:
    """Next-token cross-entropy of a pre-norm causal transformer (without positional encodings:
    its matrix products are what this benchmark is about)."""

    def norm(x, scale):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale

    x = params["embed"][tokens[:, :-1]]
    batch, length, width = x.shape
    causal = jnp.tril(jnp.ones((length, length), bool))
    for layer in params["layers"]:
        h = norm(x, layer["ln1"])
        q, k, v = (
            (h @ layer[w]).reshape(batch, length, heads, width // heads) for w in ("wq", "wk", "wv")
        )
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(width // heads)
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, length, width)
        x = x + attended @ layer["wo"]
        h = norm(x, layer["ln2"])
        x = x + jax.nn.gelu(h @ layer["w_up"]) @ layer["w_down"]
    logits = norm(x, params["ln_f"]) @ params["head"]
    return jnp.mean(modopt.losses.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]))


def optimizer_step(params, optimizer, grads):
    return optimizer.step(params, grads)


def train_step(params, optimizer, tokens):
    loss, grads = jax.value_and_grad(forward_loss)(params, tokens)
    params, optimizer = optimizer.step(params, grads)
    return params, optimizer, loss


def state_bytes(optimizer) -> tuple[int, int]:
    """(all the state's bytes, the most that one device holds), read off the arrays. The total
    counts the owner scheme's stacks without their padding units (`modopt.sharding.unpadded`:
    zeros stored so that each device owns as many units), the most per device with them."""
    logical = [x for x in jax.tree_util.tree_leaves(modopt.sharding.unpadded(optimizer).state) if hasattr(x, "dtype")]
    total = sum(x.size * x.dtype.itemsize for x in logical)
    leaves = [x for x in jax.tree_util.tree_leaves(optimizer.state) if hasattr(x, "dtype")]
    held: dict = {}
    for x in leaves:
        for shard in x.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return total, max(held.values())


def timed(fn, args, repeats: int) -> float:
    """The median seconds of `fn(*args)` (results fed back as the next arguments, blocked on)."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
        args = (*out[:2], *args[2:])
    return statistics.median(times[1:])


def _relative_difference(ours, reference) -> float:
    """The largest difference of any leaf, in units of that leaf's largest magnitude."""
    worst = 0.0
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(reference)):
        if not jnp.issubdtype(b.dtype, jnp.floating) or not b.size:
            continue
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        worst = max(worst, float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), np.finfo(np.float32).tiny)))
    return worst


@functools.lru_cache(maxsize=None)
def _one_device(name: str, layers: int, width: int, vocab: int) -> tuple:
    """The optimizer step on one device (the same for every layout): the optimizer, its compiled
    step and that step's `compiled_cost`."""
    host_params = make_params(model_shapes(layers, width, vocab), 0)
    single = modopt.Optimizer(OPTIMIZERS[name][0](), host_params, group_small_leaves=False)  # the sharded state's layout
    compiled = jax.jit(optimizer_step).lower(host_params, single, host_params).compile()
    return single, compiled, modopt.sharding.compiled_cost(compiled)


def _put(tree, shardings):
    """Host arrays put on `shardings` in new buffers, which a donating step may consume (from
    device arrays, `device_put` reuses a replicated leaf's buffer even with `may_alias=False`)."""
    assert all(isinstance(x, np.ndarray) for x in jax.tree_util.tree_leaves(tree)), "host arrays only"
    return jax.device_put(tree, shardings)


def _check_gradients(shapes: dict, steps: int) -> list:
    return [make_params(shapes, 100 + i) for i in range(steps)]


@functools.lru_cache(maxsize=None)
def _one_device_steps(name: str, layers: int, width: int, vocab: int, steps: int) -> tuple:
    """The parameters and state after `steps` one-device steps on `_check_gradients` (the same
    for every layout)."""
    single, compiled, _ = _one_device(name, layers, width, vocab)
    shapes = model_shapes(layers, width, vocab)
    one = (make_params(shapes, 0), single)
    for g in _check_gradients(shapes, steps):
        one = compiled(*one, g)
    return one[0], one[1].state


def measure(name: str, layout: str, size: dict, *, time_steps: bool = True, check_steps: int = 0) -> dict:
    """One optimizer on one layout: the row of the table (see the module's docstring). With
    `check_steps`, the sharded optimizer step also runs that many times beside the one-device
    step on the same gradients, and the row has the largest relative difference of their
    parameters and states ("difference from one device")."""
    make, period = OPTIMIZERS[name]
    mesh, spec_fn, zero_axis, batch_spec = layouts()[layout]
    shapes = model_shapes(size["layers"], size["width"], size["vocab"])
    specs = spec_fn(shapes)
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
    host_params = make_params(shapes, 0)
    param_bytes = sum(x.size * 4 for x in jax.tree_util.tree_leaves(host_params))
    unit = param_bytes / DEVICES

    single = _one_device(name, size["layers"], size["width"], size["vocab"])[2]

    params = _put(host_params, shardings)
    grads = jax.device_put(jax.tree_util.tree_map(lambda x: np.float32(0.01) * x, host_params), shardings)
    optimizer = modopt.Optimizer(make(), params, shardings=shardings, zero_axis=zero_axis)
    placed = modopt.sharding.shardings(optimizer, shardings, zero_axis=zero_axis)
    step = jax.jit(optimizer_step, donate_argnums=(0, 1), out_shardings=(shardings, placed))
    start = time.perf_counter()
    compiled = step.lower(params, optimizer, grads).compile()
    compile_seconds = time.perf_counter() - start
    cost = modopt.sharding.compiled_cost(compiled)
    total, most = state_bytes(optimizer)
    row = {
        "communication": cost.received_bytes / unit,
        "communication on a refresh": cost.received_bytes_costliest / unit,
        "communication amortized": (cost.received_bytes + (cost.received_bytes_costliest - cost.received_bytes) / period) / unit,
        "repeated work": cost.flops * DEVICES / single.flops if single.flops else float("nan"),
        "repeated decompositions": (
            cost.decomposition_flops_costliest * DEVICES / single.decomposition_flops_costliest
            if single.decomposition_flops_costliest
            else None
        ),
        "state": most / (total / DEVICES),
        "state bytes per parameter": total / (param_bytes / 4),
        "compile seconds": compile_seconds,
        "collectives": {kind: b / unit for kind, b in cost.by_kind().items()},
        "unknown trip counts": cost.unknown_trip_counts,
    }
    if check_steps:
        sharded = (_put(host_params, shardings), modopt.Optimizer(make(), params, shardings=shardings, zero_axis=zero_axis))
        for g in _check_gradients(shapes, check_steps):
            sharded = compiled(*sharded, jax.device_put(g, shardings))
            jax.block_until_ready(sharded)  # queued sharded steps can deadlock XLA's CPU collectives
        one = _one_device_steps(name, size["layers"], size["width"], size["vocab"], check_steps)
        row["difference from one device"] = _relative_difference((sharded[0], modopt.sharding.unpadded(sharded[1]).state), one)
    if time_steps:
        row["optimizer step seconds"] = timed(compiled, (params, optimizer, grads), size["repeats"])
        params = _put(host_params, shardings)
        optimizer = modopt.Optimizer(make(), params, shardings=shardings, zero_axis=zero_axis)
        tokens = jax.device_put(
            jax.random.randint(jax.random.key(1), (size["batch"], size["context"] + 1), 0, size["vocab"]),
            NamedSharding(mesh, batch_spec),
        )
        train = jax.jit(train_step, donate_argnums=(0, 1), out_shardings=(shardings, placed, None))
        row["train step seconds"] = timed(train, (params, optimizer, tokens), size["repeats"])
    return row


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", default=None, help="folder for pod.txt and pod.json (default: benchmarks/ for the full size)")
    parser.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS))
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    out = args.out or (HERE if args.size == "full" else None)
    results: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {DEVICES} simulated CPU devices", "size": size, "layouts": {}}
    lines = [f"modopt matrix optimizers on {DEVICES} devices ({results['machine']}; jax {jax.__version__})", ""]
    for layout in layouts():
        rows = {}
        for name in args.optimizers:
            rows[name] = measure(name, layout, size)
            print(f"{layout} {name}: {json.dumps(rows[name])}", file=sys.stderr, flush=True)
        results["layouts"][layout] = rows
        base = rows.get("adamw")
        lines.append(f"{layout}: communication in units of P/N; ratios per device; times against AdamW's (CPU)")
        header = f"{'optimizer':10} {'comm':>6} {'refresh':>8} {'amort.':>7} {'work':>6} {'decomp':>6} {'state':>6} {'B/param':>8} {'opt step':>9} {'train':>7} {'compile':>8}"
        lines.append(header)
        for name, row in rows.items():
            ratio = lambda key: row[key] / base[key] if base else float("nan")  # noqa: E731
            decompositions = "-" if row["repeated decompositions"] is None else f"{row['repeated decompositions']:.2f}"
            lines.append(
                f"{name:10} {row['communication']:6.2f} {row['communication on a refresh']:8.2f} "
                f"{row['communication amortized']:7.2f} {row['repeated work']:6.2f} {decompositions:>6} {row['state']:6.2f} "
                f"{row['state bytes per parameter']:8.1f} {ratio('optimizer step seconds'):8.2f}x {ratio('train step seconds'):6.2f}x "
                f"{row['compile seconds']:7.1f}s"
            )
        lines.append("")
    lines.append(
        f"Goals: communication amortized at most {GOALS['communication']['fsdp']['muon']} (Muon family) and "
        f"{GOALS['communication']['fsdp']['shampoo']} (Shampoo, SOAP, Kron) under FSDP, one more under TP+ZeRO-1, "
        f"at most {GOALS['refresh']} on a refresh; work and decompositions at most {GOALS['repeated work']}; state at most {GOALS['state']}."
    )
    lines.append("Kron refreshes with a probability annealed from 1: amortized here over a period of 1 (its first steps).")
    text = "\n".join(lines)
    print(text)
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "pod.txt"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(out, "pod.json"), "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()
