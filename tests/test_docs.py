"""The API reference covers the public API, and public docstrings document every argument.

Cheap checks on the sources (no site build; CI builds the site with `mkdocs build --strict`):
every public name of `modopt` and of its public submodules is on a page of `docs/` (a
`::: modopt.X` directive, a `members:` list, or the heading of the directive that documents the
same object, as in "adam (Adam)"), every notebook is in the site's navigation, and every public
function and constructor has an `Args:` section naming each of its parameters. Every reference
in a docstring links to its source, the pages show public paths and the fields' types (read
from the package as the site's griffe extension reads it), and they load nothing from the
network: formulas are rendered to MathML when the site is built.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import textwrap
import types
import typing

import pytest
import yaml

import modopt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

# Public submodules documented besides the top-level namespace. `modopt.integrations` is
# installed from integrations/; its modules import their library lazily, at use.
SUBMODULES = sorted(
    {f"modopt.{n}" for n, o in vars(modopt).items() if isinstance(o, types.ModuleType) and not n.startswith("_")}
    | {"modopt.catalog", "modopt.integrations.flax", "modopt.integrations.orbax"}
)



def declared_names(module: types.ModuleType) -> set[str]:
    """The names a module's source declares: what it defines (def, class, assignment) and what
    it re-exports explicitly (`from ._x import Name as Name`, PEP 484's convention), not what
    it imports for its own use."""
    if hasattr(module, "__all__"):
        return set(module.__all__)
    tree = ast.parse(open(inspect.getsourcefile(module)).read())
    names: set[str] = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, ast.ImportFrom):
                names.update(a.name for a in node.names if a.asname == a.name)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse + getattr(node, "finalbody", []))

    visit(tree.body)
    return names


def public_names(module: types.ModuleType, top_level: bool = False) -> dict[str, object]:
    """The public names of a module: for the top level every non-module name without a leading
    underscore (the README's table lists the same); for a submodule, the names its source
    declares (see `declared_names`)."""
    declared = None if top_level else declared_names(module)
    return {
        name: value
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and (declared is None or name in declared)
    }


def all_public() -> dict[str, object]:
    """Every public name, by its full dotted path."""
    found = {f"modopt.{n}": v for n, v in public_names(modopt, top_level=True).items()}
    for path in SUBMODULES:
        module = importlib.import_module(path)
        found.update({f"{path}.{n}": v for n, v in public_names(module).items()})
    return found


def directives() -> list[tuple[str, dict, str]]:
    """Each `::: identifier` block of docs/: (identifier, options, page)."""
    found = []
    for folder, _, files in os.walk(DOCS):
        for name in sorted(files):
            if not name.endswith(".md"):
                continue
            page = os.path.relpath(os.path.join(folder, name), DOCS)
            text = open(os.path.join(folder, name)).read()
            for match in re.finditer(r"^::: *(\S+)[ \t]*\n((?:[ \t]+\S.*\n?)*)", text, re.M):
                block = yaml.safe_load(textwrap.dedent(match.group(2))) if match.group(2).strip() else None
                found.append((match.group(1), (block or {}).get("options", {}), page))
    return found


def resolve(path: str) -> object:
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            value = getattr(value, part)
        return value
    raise ImportError(path)


def identity_matters(value: object) -> bool:
    """Whether `x is y` means the same documented object (not for small ints, strings, None)."""
    return not isinstance(value, (int, float, str, bytes, tuple, type(None)))


def documented() -> tuple[set[str], list[tuple[object, str]]]:
    """Paths named by a directive or a members list, and (object, heading) of each directive."""
    paths, objects = set(), []
    for identifier, options, page in directives():
        try:
            value = resolve(identifier)
        except (ImportError, AttributeError) as error:
            pytest.fail(f"docs/{page}: `::: {identifier}` names nothing: {error}")
        paths.add(identifier)
        heading = str(options.get("heading", ""))
        objects.append((value, f"{heading} {identifier.rsplit('.', 1)[-1]}"))
        if isinstance(value, types.ModuleType):
            members = options.get("members", True)
            chosen = public_names(value, top_level=value is modopt) if members is True else (members or [])
            for name in chosen:
                paths.add(f"{identifier}.{name}")
                objects.append((getattr(value, name), name))
    return paths, objects


def test_every_public_name_is_on_a_page():
    paths, objects = documented()
    missing = []
    for path, value in all_public().items():
        name = path.rsplit(".", 1)[-1]
        if path in paths:
            continue
        same = [heading for obj, heading in objects if identity_matters(value) and obj is value]
        if not any(re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", heading) for heading in same):
            missing.append(path)
    assert not missing, (
        f"public names on no page of docs/: {missing}. Add a `::: {missing[0]}` directive to the page "
        "of its family, or its name to the heading of the directive documenting the same object."
    )


def test_every_directive_target_is_public():
    """A page documents the public path of each object, not a private module's."""
    private = [(identifier, page) for identifier, _, page in directives() if "._" in identifier]
    assert not private, private


def test_every_notebook_is_in_the_navigation():
    config = open(os.path.join(ROOT, "mkdocs.yml")).read()
    notebooks = sorted(n for n in os.listdir(os.path.join(ROOT, "notebooks")) if n.endswith(".ipynb"))
    assert notebooks, "no notebook found"
    missing = [n for n in notebooks if f"notebooks/{n}" not in config]
    assert not missing, f"notebooks missing from the nav of mkdocs.yml: {missing}"


def args_section(doc: str | None) -> set[str] | None:
    """The names an `Args:` section describes, or None without one."""
    if not doc:
        return None
    doc = inspect.cleandoc(doc)
    match = re.search(r"^(Args|Arguments|Parameters):[ \t]*\n((?:[ \t]+.*\n?|[ \t]*\n)*)", doc, re.M)
    if match is None:
        return None
    body = textwrap.dedent(match.group(2))
    return set(re.findall(r"^\**(\w+)(?: \([^)]*\))?:", body, re.M))


def is_protocol(value: type) -> bool:
    return bool(getattr(value, "_is_protocol", False))


def constructors_and_functions() -> dict[str, object]:
    """Every public function and constructor (NamedTuple states, protocols, abstract base
    classes, enums, exceptions and type aliases have no arguments to document)."""
    found, seen = {}, set()
    for path, value in sorted(all_public().items(), key=lambda item: (item[0].count("."), item[0])):
        if id(value) in seen:
            continue  # documented once
        if inspect.isclass(value):
            skipped = (
                issubclass(value, (tuple, BaseException))
                or is_protocol(value)
                or inspect.isabstract(value)
                or value.__name__.startswith("Abstract")
                or isinstance(value, type(typing.Any))
                or hasattr(value, "__members__")  # an enum
            )
            if skipped:
                continue
        elif not inspect.isfunction(value):
            continue
        seen.add(id(value))
        found[path] = value
    return found


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def parameters(value: object) -> list[str]:
    """The named parameters a docstring must describe (`*args` and `**kwargs` may be described)."""
    return [
        p.name
        for p in inspect.signature(value).parameters.values()
        if p.kind not in _VARIADIC and p.name != "self" and not p.name.startswith("_")
    ]


CALLABLES = constructors_and_functions()


@pytest.mark.parametrize("path", list(CALLABLES))
def test_docstring_has_an_args_section_naming_every_parameter(path):
    value = CALLABLES[path]
    params = parameters(value)
    if not params:
        return
    described = args_section(value.__doc__)
    assert described is not None, f"{path}{inspect.signature(value)}: the docstring has no `Args:` section"
    missing = [p for p in params if p not in described]
    assert not missing, f"{path}: the `Args:` section does not describe {missing}"
    variadic = {p.name for p in inspect.signature(value).parameters.values() if p.kind in _VARIADIC}
    unknown = sorted(described - set(params) - variadic)
    assert not unknown, f"{path}: the `Args:` section describes {unknown}, which are not parameters"



LINK = re.compile(r"https?://|\]\(")


def reference_entries(doc: str) -> list[str]:
    """The entries of a docstring's `Reference:`/`References:` paragraph (separated by blank
    lines, list items, or `; ` before a capitalized author)."""
    entries = []
    for match in re.finditer(r"^References?:[ \t]*(.*(?:\n[ \t]*\S.*)*)", inspect.cleandoc(doc), re.M):
        for paragraph in re.split(r"\n[ \t]*\n|\n[ \t]*[-*] ", match.group(1)):
            entries += [e.strip() for e in re.split(r";\s+(?=[A-Z])", paragraph) if e.strip()]
    return entries


def test_reference_entries_are_split_as_written():
    doc = """Summary.

    References: Liu et al., 2025, "Muon is Scalable", https://arxiv.org/abs/2502.16982; Boissin
    et al., 2025 (AOL), https://arxiv.org/abs/2512.04632; Pflug, 1996, a book
    """
    assert reference_entries(doc) == [
        'Liu et al., 2025, "Muon is Scalable", https://arxiv.org/abs/2502.16982',
        "Boissin\net al., 2025 (AOL), https://arxiv.org/abs/2512.04632",
        "Pflug, 1996, a book",
    ]


def test_every_reference_links_to_its_source():
    """A reference names its source with a link (a URL, which the site makes a link, or a
    Markdown link), not as plain text."""
    unlinked, seen = [], set()
    documented_objects = {**all_public(), **{p: importlib.import_module(p) for p in SUBMODULES}}
    for path, value in sorted(documented_objects.items()):
        if id(value) in seen or not (inspect.isclass(value) or inspect.isroutine(value) or inspect.ismodule(value)):
            continue
        seen.add(id(value))
        unlinked += [f"{path}: {e!r}" for e in reference_entries(value.__doc__ or "") if not LINK.search(e)]
    assert not unlinked, "references without a link:\n" + "\n".join(unlinked)


@pytest.fixture(scope="module")
def griffe_modopt():
    """The package as the site's griffe extension (docs/griffe_modopt.py) presents it."""
    griffe = pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location("griffe_modopt", os.path.join(DOCS, "griffe_modopt.py"))
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    package = griffe.load(
        "modopt",
        force_inspection=True,
        extensions=griffe.load_extensions(extension.ModoptDocs),
        docstring_parser="google",
    )
    return extension, package


def test_pages_show_public_paths(griffe_modopt):
    """No class base or annotation on the pages names a private module
    (`modopt._core.base.AbstractComposite`, `equinox._module._module.Module`)."""
    extension, package = griffe_modopt
    assert extension.private_paths(package) == []
    assert package["Adam"].bases == ["modopt.AbstractComposite"]
    assert package["AbstractTransform"].bases == ["equinox.Module"]


def test_constructors_show_the_fields_types(griffe_modopt):
    """A constructor that Equinox generates shows each field's type, not `Any`."""
    _, package = griffe_modopt
    shown = {p.name: str(p.annotation) for p in package["Adam"].members["__init__"].parameters}
    assert shown["learning_rate"] == "ScalarOrSchedule"
    assert shown["b1"] == shown["eps"] == "Scalar"
    assert shown["mu_dtype"] == "DTypeLike | None"
    annotation = package["Adam"].members["__init__"].parameters["b1"].annotation
    assert annotation.canonical_path == "modopt.Scalar"


def test_math_is_rendered_to_mathml_at_build_time():
    """Formulas become MathML when the site is built (docs/hooks.py): no script, no network."""
    spec = importlib.util.spec_from_file_location("docs_hooks", os.path.join(DOCS, "hooks.py"))
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (
        '<p>a <span class="arithmatex">\\(x_{t+1} = x_t - \\eta\\,\\tfrac{1}{2}\\)</span></p>'
        '<div class="arithmatex">\\[\\ell(x) = \\max\\!\\big(0, 1 - x\\big)\\]</div>'
    )
    rendered = hooks.render_math(page, "test")
    assert rendered.count("<math ") == 2 and 'display="block"' in rendered
    shown = re.sub(r"<annotation .*?</annotation>", "", rendered)
    assert "\\(" not in shown and "\\[" not in shown and "<mfrac>" in shown
    assert "mathspace" not in rendered  # MathML Core has no named spaces
    for wrong in ("x^", "\\operatornam{diag}"):  # an error, an unknown command
        with pytest.raises(Exception, match="cannot render"):
            hooks.render_math(f'<span class="arithmatex">\\({wrong}\\)</span>', "test")
    config = open(os.path.join(ROOT, "mkdocs.yml")).read()
    loaded = [line for line in config.splitlines() if re.search(r"https?://", line.split("#")[0])]
    assert not loaded, f"mkdocs.yml loads from the network: {loaded}"
