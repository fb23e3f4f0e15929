"""An independent NumPy reference of trax 1.4.1's optimizers, in float64.

Written from trax's source (`trax/optimizers/{base,adam,momentum,rms_prop,adafactor,sm3}.py`)
and the account in `shared/TRAX.md`; it shares no code with `modopt.trax`. Per weight,
`Reference.init(w) -> slots` and `Reference.update(step, g, w, slots, opt_params) ->
(new_w, new_slots)`; over a trax tree, `tree_init` and `tree_update` with trax's flatten order
(lists and tuples in order, dicts by insertion order), gradient clipping and metrics.

Two choices where trax itself fails or drifts: a rank-0 weight in SM3 is the diagonal case with
one accumulator of shape () (trax raises IndexError), and slots keep their dtype (the momentum
slot of `momentum_in_bfloat16` is rounded to bfloat16 when stored).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

DEFAULTS: dict[str, dict[str, Any]] = {
    # name: constructor defaults (trax order); "static" names are fixed at construction.
    "sgd": {"learning_rate": 0.01, "clip_grad_norm": None},
    "momentum": {"learning_rate": 0.01, "mass": 0.9, "weight_decay_rate": 1e-5, "nesterov": True},
    "rmsprop": {"learning_rate": 0.001, "gamma": 0.9, "eps": 1e-8, "clip_grad_norm": None},
    "adam": {
        "learning_rate": 1e-4, "weight_decay_rate": 1e-5, "b1": 0.9, "b2": 0.999, "eps": 1e-5,
        "clip_grad_norm": None,
    },
    "adafactor": {
        "learning_rate": 0.05, "factored": True, "multiply_by_parameter_scale": True, "do_clipping": True,
        "do_momentum": False, "momentum_in_bfloat16": False, "beta1": 0.0, "decay_rate": 0.8,
        "clipping_threshold": 1.0, "weight_decay_rate": 1e-5, "weight_decay_n_steps": 0, "epsilon1": 1e-16,
        "epsilon2": 1e-3,
    },
    "sm3": {
        "learning_rate": 0.01, "momentum": 0.9, "second_moment_averaging": 1.0, "weight_decay": 0.0,
        "momentum_type": 1,
    },
}  # fmt: skip
STATIC = {
    "clip_grad_norm", "nesterov", "factored", "multiply_by_parameter_scale", "do_clipping", "do_momentum",
    "momentum_in_bfloat16", "momentum_type",
}  # fmt: skip
EMA, HEAVY_BALL, NESTEROV = 1, 2, 3


def trax_flatten(tree: Any) -> list[Any]:
    if isinstance(tree, (list, tuple)):
        return [x for child in tree for x in trax_flatten(child)]
    if isinstance(tree, dict):
        return [x for child in tree.values() for x in trax_flatten(child)]
    return [tree]


def trax_unflatten(leaves: list[Any], like: Any) -> Any:
    it = iter(leaves)

    def build(node):
        if isinstance(node, list):
            return [build(c) for c in node]
        if isinstance(node, tuple):
            return tuple(build(c) for c in node)
        if isinstance(node, dict):
            return {k: build(c) for k, c in node.items()}
        return next(it)

    return build(like)


def f64(x: Any) -> np.ndarray:
    return np.asarray(x, np.float64)


def norm(leaves: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(f64(x) ** 2) for x in leaves)))


class Reference:
    """One trax optimizer, by name (`sgd`, `momentum`, `rmsprop`, `adam`, `adafactor`, `sm3`)."""

    def __init__(self, name: str, **kwargs: Any):
        self.name = name
        config = dict(DEFAULTS[name])
        extra = {k: v for k, v in kwargs.items() if k not in config}
        if extra and name != "sgd":
            raise TypeError(f"unknown arguments {extra}")
        config.update(kwargs)
        self.static = {k: v for k, v in config.items() if k in STATIC}
        dynamic = {k: v for k, v in config.items() if k not in STATIC and k != "learning_rate"}
        self.opt_params = {**dynamic, "learning_rate": config["learning_rate"]}  # learning_rate last
        if name == "sm3":  # decided once, from the constructor's values
            self.static["has_momentum"] = config["momentum"] > 0
            self.static["graft"] = config["second_moment_averaging"] != 1.0

    # ---- per weight ----

    def init(self, w: Any) -> Any:
        w = np.asarray(w)
        s = self.static
        if self.name == "sgd":
            return None
        if self.name == "momentum":
            return np.zeros(w.shape)
        if self.name == "rmsprop":
            return np.ones(w.shape)
        if self.name == "adam":
            return (np.zeros(w.shape), np.zeros(w.shape))
        if self.name == "adafactor":
            if s["factored"] and w.ndim >= 2:
                slots = [np.zeros(w.shape[:-1]), np.zeros(w.shape[:-2] + w.shape[-1:])]
            else:
                slots = [np.zeros(w.shape)]
            if s["do_momentum"]:
                slots.append(np.zeros(w.shape))
            return slots
        # sm3
        v1 = [np.zeros(n) for n in w.shape] if w.ndim else [np.zeros(())]
        v2 = [np.zeros(a.shape) for a in v1] if s["graft"] else []
        return (np.zeros(w.shape) if s["has_momentum"] else [], v1, v2)

    def update(self, step: int, g: Any, w: Any, slots: Any, p: dict[str, Any]) -> tuple[np.ndarray, Any]:
        g, w = f64(g), f64(w)
        return getattr(self, f"_{self.name}")(int(step), g, w, slots, {k: float(v) for k, v in p.items()})

    def _sgd(self, step, g, w, slots, p):
        return w - p["learning_rate"] * g, None

    def _momentum(self, step, g, w, v, p):
        v = p["mass"] * f64(v) + g
        u = p["mass"] * v + g if self.static["nesterov"] else v
        return (1 - p["weight_decay_rate"]) * w - p["learning_rate"] * u, v

    def _rmsprop(self, step, g, w, s, p):
        s = p["gamma"] * f64(s) + (1 - p["gamma"]) * g**2
        return w - p["learning_rate"] * g / (np.sqrt(s) + p["eps"]), s

    def _adam(self, step, g, w, slots, p):
        m, v = (f64(x) for x in slots)
        t = step + 1
        m = (1 - p["b1"]) * g + p["b1"] * m
        v = (1 - p["b2"]) * g**2 + p["b2"] * v
        m_hat, v_hat = m / (1 - p["b1"] ** t), v / (1 - p["b2"] ** t)
        return (1 - p["weight_decay_rate"]) * w - p["learning_rate"] * m_hat / (np.sqrt(v_hat) + p["eps"]), (m, v)

    def _adafactor(self, step, g, w, slots, p):
        s = self.static
        n = p["weight_decay_n_steps"]
        wd = p["weight_decay_rate"] if n < 1 else p["weight_decay_rate"] * max(n - step, 0.0) / n
        decay = 1.0 - (step + 1.0) ** (-p["decay_rate"])
        mix = 1.0 - decay
        scale = p["learning_rate"]
        if s["multiply_by_parameter_scale"]:
            scale *= max(np.sqrt(np.mean(w * w)), p["epsilon2"])
        new_slots = []
        if s["factored"] and w.ndim >= 2:
            row = decay * f64(slots[0]) + mix * np.mean(g * g, axis=-1)
            col = decay * f64(slots[1]) + mix * np.mean(g * g, axis=-2)
            row_factor = np.sqrt(np.mean(row, axis=-1, keepdims=True) / (row + p["epsilon1"]))
            col_factor = (col + p["epsilon1"]) ** -0.5
            y = g * row_factor[..., None] * col_factor[..., None, :]
            new_slots += [row, col]
        else:
            v = decay * f64(slots[0]) + mix * g * g
            y = g * (v + p["epsilon1"]) ** -0.5
            new_slots.append(v)
        if s["do_clipping"]:
            y = y / max(1.0, np.sqrt(np.mean(y * y)) / p["clipping_threshold"])
        sub = scale * y
        if s["do_momentum"]:
            m = p["beta1"] * f64(slots[-1]) + (1.0 - p["beta1"]) * sub
            sub = m
            if s["momentum_in_bfloat16"]:
                m = f64(m.astype(np.float32).astype(ml_dtypes.bfloat16))
            new_slots.append(m)
        return (1 - wd) * w - sub, new_slots

    def _sm3(self, step, g, w, slots, p):
        s = self.static
        m, v1, v2 = slots
        b2 = p["second_moment_averaging"]
        c = 1.0 if b2 == 1 else 1.0 - b2

        def bound(vectors):
            if w.ndim == 0:
                return f64(vectors[0])
            out = np.full(w.shape, np.inf)
            for i, a in enumerate(vectors):
                shape = [1] * w.ndim
                shape[i] = w.shape[i]
                out = np.minimum(out, f64(a).reshape(shape))
            return out

        def reduce(acc):
            if w.ndim <= 1:
                return [acc]
            return [np.max(acc, axis=tuple(j for j in range(w.ndim) if j != i)) for i in range(w.ndim)]

        def precondition(acc):
            with np.errstate(divide="ignore"):
                return np.where(acc > 0, 1.0 / (np.sqrt(acc) + 1e-16), 0.0)

        acc = b2 * bound(v1) + c * g * g
        pg = precondition(acc) * g
        new_v2 = []
        if s["graft"]:
            acc2 = bound(v2) + g * g
            graft = precondition(acc2) * g
            pg = pg * (np.linalg.norm(graft.ravel()) / (np.linalg.norm(pg.ravel()) + 1e-16))
            new_v2 = reduce(acc2)
        pg = pg + p["weight_decay"] * w
        beta1 = p["momentum"]
        if not s["has_momentum"]:
            u, new_m = pg, []
        elif s["momentum_type"] == EMA:
            new_m = (1 - beta1) * pg + beta1 * f64(m)
            u = new_m
        elif s["momentum_type"] == HEAVY_BALL:
            new_m = pg + beta1 * f64(m)
            u = new_m
        else:
            new_m = pg + beta1 * f64(m)
            u = pg + beta1 * new_m
        return w - p["learning_rate"] * u, (new_m, reduce(acc), new_v2)

    # ---- whole tree ----

    def tree_init(self, weights: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return tuple(self.init(w) for w in trax_flatten(weights)), self.opt_params

    def tree_update(self, step, grads, weights, slots, opt_params):
        gs = [f64(g) for g in trax_flatten(grads)]
        ws = [f64(w) for w in trax_flatten(weights)]
        g_norm = norm(gs)
        clip = self.static.get("clip_grad_norm")
        if clip is not None and not g_norm < clip:
            gs = [g * (clip / g_norm) for g in gs]
        pairs = [self.update(step, g, w, s, opt_params) for g, w, s in zip(gs, ws, slots)]
        metrics = {"gradients_l2": g_norm, "weights_l2": norm(ws)}
        return trax_unflatten([w for w, _ in pairs], weights), tuple(s for _, s in pairs), metrics
