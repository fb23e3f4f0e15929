"""`modopt.catalog` lists the seeds' public names, and every one of them exists in modopt."""

from __future__ import annotations

import modopt.catalog as catalog


def test_every_catalog_name_is_present():
    missing = [name for names in catalog.FAMILIES.values() for name in names if not catalog.present(name)]
    assert missing == []


def test_present_is_false_for_names_modopt_lacks():
    assert not catalog.present("no_such_optimizer")
    assert not catalog.present("no_such_package.adam")


def test_report_prints_a_line_per_family(capsys):
    catalog.report()
    out = capsys.readouterr().out
    assert all(family in out for family in catalog.FAMILIES)
    assert "missing: none" in out
