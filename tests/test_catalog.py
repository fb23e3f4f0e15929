"""`modopt.catalog` lists the seeds' public names and optax 0.2.8's, and every one of them exists
in modopt."""

from __future__ import annotations

import modopt.catalog as catalog
import pages


def test_every_catalog_name_is_present():
    assert catalog.missing(catalog.FAMILIES) == []
    assert catalog.missing(catalog.OPTAX) == []


def test_the_optax_catalog_is_optax_0_2_8s_public_names():
    """Every public name of optax's namespaces, read off the installed optax 0.2.8."""
    import types

    import optax
    import pytest

    if optax.__version__ != "0.2.8":
        pytest.skip(f"the catalog lists optax 0.2.8's names; optax {optax.__version__} is installed")
    for namespace, names in catalog.OPTAX.items():
        module = optax
        for part in namespace.split(".")[1:]:
            module = getattr(module, part)
        theirs = {
            name
            for name in dir(module)
            if not name.startswith("_")
            and not (isinstance(getattr(module, name), types.ModuleType) and not getattr(module, name).__name__.startswith(module.__name__ + "."))
        }
        ours = {name.rsplit(".", 1)[-1] for name in names}
        assert ours <= theirs, f"{namespace}: names optax lacks {sorted(ours - theirs)}"
        typing_names = {name for name in theirs - ours if name in {"Any", "NamedTuple", "Protocol", "Sequence", "Callable", "Optional", "Union"}}
        assert theirs - ours == typing_names, f"{namespace}: names the catalog lacks {sorted(theirs - ours - typing_names)}"


def test_present_is_false_for_names_modopt_lacks():
    assert not catalog.present("no_such_optimizer")
    assert not catalog.present("no_such_package.adam")


def test_report_prints_a_line_per_family_of_both_catalogs(capsys):
    catalog.report()
    out = capsys.readouterr().out
    assert all(family in out for family in [*catalog.FAMILIES, *catalog.OPTAX])
    assert out.count("missing: none") == 2


def test_guide_function_family_examples_run():
    import re

    import numpy as np

    section = pages.section("docs/guides/training.md", "Losses, linear algebra, second order, Monte Carlo gradients")
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 3
    spaces = [{} for _ in blocks]
    for code, space in zip(blocks, spaces):
        exec(compile(code, "docs/guides/training.md", "exec"), space)
    losses, second_order, monte_carlo = spaces
    assert losses["per_example"].shape == (2,)
    # The mean squared error's Hessian diagonal: 2 for the bias, 2 * mean(x_j ** 2) for w_j.
    x = np.asarray(second_order["x"])
    expected = np.concatenate([[2.0], 2 * np.mean(x**2, axis=0)])
    hessian = second_order["second_order"].hessian_diag(
        second_order["loss"], second_order["params"], second_order["x"], second_order["y"]
    )
    np.testing.assert_allclose(hessian, expected, rtol=1e-6)
    # Pathwise rows of E|x|^2 for x ~ N(mean, exp(log_std)^2): 2 * mean and 2 * exp(2 log_std).
    means = [np.asarray(row).mean(axis=0) for row in monte_carlo["rows"]]
    np.testing.assert_allclose(means[0], [2.0, -1.0], atol=0.2)
    np.testing.assert_allclose(means[1], [2.0, 2.0], atol=0.2)


def test_guide_coverage_block_is_the_report(capsys):
    import re

    section = pages.section("docs/guides/training.md", "Losses, linear algebra, second order, Monte Carlo gradients")
    (block,) = re.findall(r"```text\n(.*?)```", section, re.S)
    catalog.report()
    report = capsys.readouterr().out.splitlines()
    shown = [line for line in block.splitlines() if line != "..."]
    assert shown[:2] == report[:2] and shown[-3:] == report[-3:]
    rest = iter(report)  # every line shown is the report's, in the report's order
    assert all(any(line == other for other in rest) for line in shown), "the block is not the report's"


def test_a_name_of_a_namespace_asked_for_at_the_top_level_is_an_error_saying_where_it_is():
    """`modopt.muon` is `modopt.contrib.muon`, as in optax: the error says so, every place it
    names holds the name, and a name found nowhere gets the plain error."""
    import functools
    import re

    import pytest

    import modopt

    with pytest.raises(AttributeError, match=r"no attribute 'muon'; it is modopt\.contrib\.muon$"):
        modopt.muon  # noqa: B018
    assert not hasattr(modopt, "galore") and hasattr(modopt.contrib, "galore")
    for name in ("galore", "sophia", "softmax_cross_entropy_with_integer_labels", "Adafactor", "tree_sum"):
        if hasattr(modopt, name):
            continue
        with pytest.raises(AttributeError) as error:
            getattr(modopt, name)
        places = re.findall(r"modopt(?:\.\w+)+", str(error.value).split(";", 1)[-1])
        assert places, str(error.value)
        for place in places:
            assert functools.reduce(getattr, place.split(".")[1:], modopt) is not None, place
    with pytest.raises(AttributeError, match=r"^module 'modopt' has no attribute 'no_such_optimizer'$"):
        modopt.no_such_optimizer  # noqa: B018
