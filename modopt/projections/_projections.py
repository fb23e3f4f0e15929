"""Euclidean projections of pytrees onto convex sets (and two spheres).

Each function returns `argmin_p ||x - p||_2^2` over its set, where the norm is taken over all
leaves of the tree together. Trees go in and come out with the same structure.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .._util.trees import sum_of_squares, vdot
from .._core.fields import Scalar


def _same_structure(x: Any, a: Any, where: str) -> None:
    """A clear error when the tree `a` that defines a set is not shaped like the tree `x`."""
    x_def, a_def = jax.tree_util.tree_structure(x), jax.tree_util.tree_structure(a)
    if x_def != a_def:
        raise ValueError(
            f"{where}: the tree `a` must have the structure of the projected tree `x`; "
            f"got x: {x_def} and a: {a_def}."
        )
    for (path, xi), ai in zip(jax.tree_util.tree_leaves_with_path(x), jax.tree_util.tree_leaves(a)):
        if jnp.shape(xi) != jnp.shape(ai):
            raise ValueError(
                f"{where}: leaf {jax.tree_util.keystr(path) or '<root>'} of `a` has shape "
                f"{jnp.shape(ai)}, the projected tree's has {jnp.shape(xi)}."
            )


def _bound_like(bound: Any, tree: Any) -> Any:
    """A bound given as one scalar (or array) for every leaf, or as a tree shaped like `tree`."""
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(bound)):
        return jax.tree_util.tree_map(lambda _: bound, tree)
    return bound


def _scaled(factor: Any, tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: factor * x, tree)


def _l1_norm(tree: Any) -> jax.Array:
    return sum((jnp.sum(jnp.abs(x)) for x in jax.tree_util.tree_leaves(tree)), 0)


def projection_non_negative(tree: Any) -> Any:
    r"""Projection onto the non-negative orthant: every element clipped at 0 from below.

    $$\operatorname{argmin}_p \|x - p\|_2^2 \quad \text{subject to} \quad p \ge 0,$$
    that is, $p = \max(x, 0)$ element by element.

    Args:
        tree: the tree $x$ to project.

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_non_negative
        >>> projection_non_negative({"w": jnp.array([-1.0, 2.0])})["w"]
        Array([0., 2.], dtype=float32)
    """
    return jax.tree_util.tree_map(jax.nn.relu, tree)


def projection_box(tree: Any, lower: Any, upper: Any) -> Any:
    r"""Projection onto the box $\text{lower} \le p \le \text{upper}$: element-wise clipping.

    $$\operatorname{argmin}_p \|x - p\|_2^2 \quad \text{subject to} \quad
    \text{lower} \le p \le \text{upper}.$$

    Args:
        tree: the tree $x$ to project.
        lower: the lower bound: a scalar, or a tree with the structure of `tree`.
        upper: the upper bound: a scalar, or a tree with the structure of `tree`.

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_box
        >>> projection_box(jnp.array([-2.0, 0.5, 3.0]), -1.0, 1.0)
        Array([-1. ,  0.5,  1. ], dtype=float32)

    Note:
        optax 0.2.8 maps `jnp.clip` over the three trees, so a scalar bound only works when
        `tree` is a single array; here a scalar bound applies to every leaf of any tree.
    """
    return jax.tree_util.tree_map(jnp.clip, tree, _bound_like(lower, tree), _bound_like(upper, tree))


def projection_hypercube(tree: Any, scale: Scalar = 1) -> Any:
    r"""Projection onto the hypercube $0 \le p \le \text{scale}$ (the unit hypercube by default).

    $$\operatorname{argmin}_p \|x - p\|_2^2 \quad \text{subject to} \quad
    0 \le p \le \text{scale}.$$

    Args:
        tree: the tree $x$ to project.
        scale: the side of the hypercube: a scalar or a tree with the structure of `tree`
            (default 1).

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_hypercube
        >>> projection_hypercube(jnp.array([-0.5, 0.5, 1.5]))
        Array([0. , 0.5, 1. ], dtype=float32)
    """
    return projection_box(tree, lower=0, upper=scale)


def _unit_simplex_threshold(v: jax.Array) -> jax.Array:
    """The threshold tau with sum(max(v - tau, 0)) = 1, by sorting (Held et al., Duchi et al.).

    With u the values sorted in decreasing order and c their running sums, the support has
    rho = #{k : u_k > (c_k - 1) / k} elements and tau = (c_rho - 1) / rho.
    """
    u = -jnp.sort(-v)
    running = jnp.cumsum(u)
    k = jnp.arange(1, v.shape[0] + 1, dtype=v.dtype)
    rho = jnp.sum(u * k > running - 1)
    return (running[rho - 1] - 1) / rho.astype(v.dtype)


@jax.custom_jvp
def _project_unit_simplex(v: jax.Array) -> jax.Array:
    """Projection of a vector onto {p >= 0, sum p = 1}."""
    return jax.nn.relu(v - _unit_simplex_threshold(v))


@_project_unit_simplex.defjvp
def _project_unit_simplex_jvp(primals, tangents):
    # On the support S of the projection, dp = dv - mean_S(dv); off it, dp = 0.
    (v,), (dv,) = primals, tangents
    p = _project_unit_simplex(v)
    on = (p > 0).astype(dv.dtype)
    mean_on = jnp.dot(on, dv) / jnp.sum(on)
    return p, on * (dv - mean_on)


def projection_simplex(tree: Any, scale: Scalar = 1) -> Any:
    r"""Projection onto the simplex $\{p \ge 0, \sum p = \text{scale}\}$ over all leaves together.

    $$\operatorname{argmin}_p \|x - p\|_2^2 \quad \text{subject to} \quad
    p \ge 0,\ p^\top \mathbf{1} = \text{scale}.$$

    The solution is $p = \max(x - \tau, 0)$ with the threshold $\tau$ found by sorting
    ($O(n \log n)$). The default projects onto the probability simplex. Its Jacobian-vector
    product is exact: on the support $S$ of $p$, $\dot p = \dot x - \text{mean}_S(\dot x)$.

    Args:
        tree: the tree $x$ to project (its leaves are flattened and concatenated).
        scale: the value the projected tree sums to (default 1).

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_simplex
        >>> p = projection_simplex({"w": jnp.array([2.5, 3.2]), "b": 0.5})
        >>> print(round(float(p["w"].sum() + p["b"]), 5))
        1.0

    References:
        Duchi et al., [Efficient projections onto the l1-ball for learning in high
        dimensions](https://dl.acm.org/doi/10.1145/1390156.1390191), 2008.
    """
    values, unravel = ravel_pytree(tree)
    return unravel(scale * _project_unit_simplex(values / scale))


def projection_l1_sphere(tree: Any, scale: Scalar = 1) -> Any:
    r"""Projection onto the l1 sphere $\{y : \|y\|_1 = \text{scale}\}$.

    $$\operatorname{argmin}_y \|x - y\|_2^2 \quad \text{subject to} \quad
    \|y\|_1 = \text{scale},$$
    solved as $y = \operatorname{sign}(x) \odot P_\Delta(|x|)$ with $P_\Delta$ the projection
    onto the simplex of radius `scale`.

    Args:
        tree: the tree $x$ to project.
        scale: the radius of the sphere (default 1).

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_l1_sphere
        >>> projection_l1_sphere(jnp.array([3.0, -1.0]))
        Array([ 1., -0.], dtype=float32)
    """
    magnitudes = projection_simplex(jax.tree_util.tree_map(jnp.abs, tree), scale)
    return jax.tree_util.tree_map(lambda x, m: jnp.sign(x) * m, tree, magnitudes)


def projection_l1_ball(tree: Any, scale: Scalar = 1) -> Any:
    r"""Projection onto the l1 ball $\{y : \|y\|_1 \le \text{scale}\}$.

    $$\operatorname{argmin}_y \|x - y\|_2^2 \quad \text{subject to} \quad
    \|y\|_1 \le \text{scale}:$$
    $x$ itself when it is inside, else its projection onto the l1 sphere.

    Args:
        tree: the tree $x$ to project.
        scale: the radius of the ball (default 1).

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_l1_ball
        >>> p = projection_l1_ball({"w": jnp.array([2.5, 3.2]), "b": 0.5})
        >>> print(round(float(abs(p["w"]).sum() + abs(p["b"])), 5))
        1.0
    """
    return jax.lax.cond(
        _l1_norm(tree) <= scale,
        lambda t: t,
        lambda t: projection_l1_sphere(t, scale),
        tree,
    )


def projection_l2_sphere(tree: Any, scale: Scalar = 1) -> Any:
    r"""Projection onto the l2 sphere $\{y : \|y\|_2 = \text{scale}\}$: $y = \text{scale}\, x / \|x\|_2$.

    $$\operatorname{argmin}_y \|x - y\|_2^2 \quad \text{subject to} \quad \|y\|_2 = \text{scale}.$$
    The norm is over all leaves together; $x = 0$ has no projection (the result is NaN).

    Args:
        tree: the tree $x$ to project.
        scale: the radius of the sphere (default 1).

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_l2_sphere
        >>> projection_l2_sphere(jnp.array([3.0, 4.0]))
        Array([0.6, 0.8], dtype=float32)
    """
    return _scaled(scale / jnp.sqrt(sum_of_squares(tree)), tree)


def projection_l2_ball(tree: Any, scale: Scalar = 1) -> Any:
    r"""Projection onto the l2 ball $\{y : \|y\|_2 \le \text{scale}\}$.

    $$\operatorname{argmin}_y \|x - y\|_2^2 \quad \text{subject to} \quad \|y\|_2 \le \text{scale}:$$
    $y = x \cdot \text{scale} / \max(\|x\|_2, \text{scale})$.

    Args:
        tree: the tree $x$ to project.
        scale: the radius of the ball (default 1).

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_l2_ball
        >>> projection_l2_ball(jnp.array([3.0, 4.0]), scale=10.0)
        Array([3., 4.], dtype=float32)
    """
    factor = scale / jnp.sqrt(jnp.maximum(sum_of_squares(tree), scale**2))
    return _scaled(factor, tree)


def projection_linf_ball(tree: Any, scale: Scalar = 1) -> Any:
    r"""Projection onto the l-infinity ball $\{y : \|y\|_\infty \le \text{scale}\}$: clipping to
    $[-\text{scale}, \text{scale}]$.

    $$\operatorname{argmin}_y \|x - y\|_2^2 \quad \text{subject to} \quad
    \|y\|_\infty \le \text{scale}.$$

    Args:
        tree: the tree $x$ to project.
        scale: the radius of the ball (default 1).

    Returns:
        A tree with the structure of `tree`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_linf_ball
        >>> projection_linf_ball(jnp.array([-3.0, 0.5, 2.0]))
        Array([-1. ,  0.5,  1. ], dtype=float32)
    """
    return jax.tree_util.tree_map(lambda x: jnp.clip(x, -scale, scale).astype(jnp.result_type(x)), tree)


def projection_vector(x: Any, a: Any) -> Any:
    r"""Projection of the tree $x$ onto the line spanned by the tree $a$.

    $$\operatorname{proj}_a x = \frac{\langle x, a \rangle}{\langle a, a \rangle}\, a.$$

    Args:
        x: the tree to project.
        a: the tree spanning the line, with the structure of `x`.

    Returns:
        A tree with the structure of `x`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_vector
        >>> projection_vector(jnp.array([2.0, 1.0]), jnp.array([1.0, 0.0]))
        Array([2., 0.], dtype=float32)
    """
    _same_structure(x, a, "projection_vector")
    return _scaled(vdot(x, a) / vdot(a, a), a)


def projection_hyperplane(x: Any, a: Any, b: Any) -> Any:
    r"""Projection onto the hyperplane $\{y : \langle a, y \rangle = b\}$.

    $$\operatorname{argmin}_y \|x - y\|_2^2 \quad \text{subject to} \quad
    \langle a, y \rangle = b:\qquad
    y = x + \frac{b - \langle a, x \rangle}{\langle a, a \rangle}\, a.$$

    Args:
        x: the tree to project.
        a: the tree normal to the hyperplane, with the structure of `x`.
        b: the scalar offset of the hyperplane.

    Returns:
        A tree with the structure of `x`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_hyperplane
        >>> projection_hyperplane(jnp.array([2.0, 1.0]), jnp.array([1.0, 0.0]), 0.5)
        Array([0.5, 1. ], dtype=float32)
    """
    _same_structure(x, a, "projection_hyperplane")
    step = (b - vdot(x, a)) / vdot(a, a)
    return jax.tree_util.tree_map(lambda xi, ai: xi + step * ai, x, a)


def projection_halfspace(x: Any, a: Any, b: Any) -> Any:
    r"""Projection onto the halfspace $\{y : \langle a, y \rangle \le b\}$.

    $$\operatorname{argmin}_y \|x - y\|_2^2 \quad \text{subject to} \quad
    \langle a, y \rangle \le b:\qquad
    y = x + \min\!\Big(0, \frac{b - \langle a, x \rangle}{\langle a, a \rangle}\Big)\, a.$$

    Args:
        x: the tree to project.
        a: the tree normal to the halfspace's boundary, with the structure of `x`.
        b: the scalar offset of the boundary.

    Returns:
        A tree with the structure of `x`.

    Example:
        >>> import jax.numpy as jnp
        >>> from modopt.projections import projection_halfspace
        >>> projection_halfspace(jnp.array([2.0, 1.0]), jnp.array([1.0, 0.0]), 0.5)
        Array([0.5, 1. ], dtype=float32)
    """
    _same_structure(x, a, "projection_halfspace")
    step = jnp.minimum((b - vdot(x, a)) / vdot(a, a), 0)
    return jax.tree_util.tree_map(lambda xi, ai: xi + step * ai, x, a)
