"""A griffe extension for modopt's API pages (loaded by mkdocs.yml).

The pages are built by inspecting the imported package (`force_inspection`), so that the
constructors of Equinox modules show their real signatures (their `__init__` is generated from
the fields). Inspection needs these repairs:

- A module or class attribute holding a value (a field's default, `REPLICATED`, the callable
  `weight_decay_mask = WeightDecayMask()`) gets the docstring of the value's type ("Convert a
  string or number to a floating point number..."). Such borrowed docstrings are dropped, and
  replaced by the attribute's own docstring in the source (the string literal after the
  assignment) where it has one. Undocumented attributes then stay hidden: a field is
  documented in its class's `Args:` section.
- A type alias (`Params = Any`, `ScalarOrSchedule = Union[...]`) is seen as the typing object
  it names, which griffe cannot resolve: it is shown as its assignment in the source, with its
  docstring.
- A named tuple's fields (a state's fields: the checkpoint format) are shown with their
  annotations and the comment after each, not as "Alias for field number 0".
- A `typing.Protocol`'s `__init__` is typing's placeholder, which griffe cannot resolve: dropped.
- The default `dataclasses.MISSING` (a required field) is shown as `MISSING`, and a module
  attribute whose value's repr is an address shows its assignment in the source.
- A Google-style "Example:" section is read as "Examples:" (code with its output; griffe makes
  "Example:" an admonition in which `>>>` lines become nested quotes).
- `modopt.integrations` is added to the package: it is installed from the top-level folder
  `integrations/` (see setup.py), where griffe's search of `modopt/` does not find it.
- A constructor that Equinox generates from the fields shows each field's annotation
  (`b1: Scalar = 0.9`, `learning_rate: ScalarOrSchedule`), not the annotation Equinox takes
  from the field's converter (`Any`), and a parameter annotated with a public alias
  (`ScalarOrSchedule`) shows the alias's name, not the `Union[...]` it stands for.
- No page shows a private path (`modopt._core.base.AbstractComposite`,
  `equinox._module._module.Module`, `jax.jaxlib._jax.Array`): class bases and the names in
  annotations are given their public path (`modopt.AbstractComposite`, `equinox.Module`,
  `jax.Array`), a private base is replaced by its own bases, and a name with no public path is
  shown without one. `private_paths(package)` lists what remains (tests/test_docs.py).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import re
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import griffe


def _package_folder(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, f"{name} is not installed (pip install -e .)"
    return Path(spec.origin).parent


@functools.cache
def assignments() -> dict[str, tuple[str, str | None, int]]:
    """Each module-level `Name = value` of modopt's source whose name is assigned once in the
    package: its value's source, its docstring (the string literal after it) and its line."""
    found: dict[str, list[tuple[str, str | None, int]]] = {}
    for path in sorted(_package_folder("modopt").rglob("*.py")):
        body = ast.parse(path.read_text()).body
        for statement, following in zip(body, [*body[1:], None]):
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                target, value = statement.targets[0], statement.value
            elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
                target, value = statement.target, statement.value
            else:
                continue
            if not isinstance(target, ast.Name):
                continue
            docstring = None
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                docstring = inspect.cleandoc(str(following.value.value))
            found.setdefault(target.id, []).append((ast.unparse(value), docstring, statement.lineno))
    return {name: places[0] for name, places in found.items() if len(places) == 1}


# Where public names are looked up, in this order, for objects that do not name their module
# (type aliases such as `ScalarOrSchedule` or `jax.typing.DTypeLike`).
_PUBLIC_MODULES = (
    "modopt",
    "modopt.fields",
    "jax",
    "jax.typing",
    "jax.numpy",
    "equinox",
    "numpy",
    "typing",
    "collections.abc",
)
_MISSING = object()


def _is_private(path: str) -> bool:
    return any(part.startswith("_") for part in path.split("."))


def locate(path: str) -> Any:
    """The Python object at a dotted path (`modopt._core.base.AbstractComposite`), or `_MISSING`."""
    parts = path.split(".")
    for stop in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:stop]))
        except Exception:  # noqa: BLE001 (not a module: try a shorter prefix)
            continue
        for part in parts[stop:]:
            obj = getattr(obj, part, _MISSING)
            if obj is _MISSING:
                break
        return obj
    return _MISSING


def public_path(name: str, obj: Any) -> str | None:
    """The public dotted path of `obj`, known as `name` where it is used, or `None`.

    A class or function is looked up in the public packages above its module (`equinox.Module`
    for `equinox._module._module.Module`); anything else by `name` in `_PUBLIC_MODULES`."""
    candidates: list[tuple[str, str]] = []
    qualname = getattr(obj, "__qualname__", None)
    module = getattr(obj, "__module__", None)
    if (inspect.isclass(obj) or inspect.isroutine(obj)) and isinstance(module, str) and isinstance(qualname, str):
        parts = module.split(".")
        for stop in range(1, len(parts) + 1):
            if parts[stop - 1].startswith("_"):
                break
            candidates.append((".".join(parts[:stop]), qualname))
    candidates += [(module_path, name) for module_path in _PUBLIC_MODULES]
    for module_path, attribute in candidates:
        found = locate(f"{module_path}.{attribute}")
        if found is obj and not _is_private(attribute):
            return f"{module_path}.{attribute}"
    return None


def _public_bases(bases: list[Any]) -> list[Any]:
    """Class bases by their public paths; a private base gives way to its own public bases."""
    result: list[Any] = []
    for base in bases:
        path = str(base)
        obj = locate(path) if _is_private(path) else _MISSING
        if obj is _MISSING:
            result.append(base)
            continue
        public = public_path(path.rsplit(".", 1)[-1], obj)
        if public is not None:
            result.append(public)
        elif inspect.isclass(obj):
            inner = [f"{b.__module__}.{b.__qualname__}" for b in obj.__bases__ if b is not object]
            result += _public_bases(inner)
        else:
            result.append(base)
    return list(dict.fromkeys(result))


def _root_names(expression: Any) -> Iterator[griffe.ExprName]:
    """The names of an annotation that are not attributes of another name (`jax` in `jax.Array`)."""
    if not isinstance(expression, griffe.Expr):
        return
    for name in expression.iterate(flat=True):
        if isinstance(name, griffe.ExprName) and not isinstance(name.parent, griffe.ExprName):
            yield name


def _publish(expression: Any, namespace: dict[str, Any] | None = None) -> None:
    """Gives each name of an annotation its public path: looked up in `namespace` (the globals of
    the module that wrote the annotation) where given, else resolved by griffe where that ends
    in a private path. A name without a public path is left without one (shown as written)."""
    for name in _root_names(expression):
        if namespace is not None:
            obj = namespace.get(name.name, getattr(builtins, name.name, _MISSING))
        else:
            path = name.canonical_path
            if not _is_private(path):
                continue
            obj = locate(path)
        if obj is _MISSING or inspect.ismodule(obj):
            continue
        public = public_path(name.name, obj)
        if public is None:
            name.parent = None  # shown as written, without the private path
        elif public.rsplit(".", 1)[0] not in ("builtins",):
            name.parent, name.name = public.rsplit(".", 1)


def _alias_names() -> dict[int, str]:
    """The public type aliases of modopt (`ScalarOrSchedule`, `Scalar`...) by identity."""
    import modopt

    return {
        id(value): name
        for name, value in vars(modopt).items()
        if not name.startswith("_") and typing.get_origin(value) is not None
    }


def _field_annotations(cls: type) -> dict[str, str]:
    """Each dataclass field of `cls` with its annotation as written (`"Scalar | None"`)."""
    written: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for field_name, annotation in vars(klass).get("__annotations__", {}).items():
            written[field_name] = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return {f.name: written[f.name] for f in dataclasses.fields(cls) if f.init and f.name in written}


def _written_parameters(function: Any) -> dict[str, str]:
    """Each annotated parameter of a function as its source writes it."""
    try:
        source = inspect.cleandoc("\n" + inspect.getsource(function))
    except (OSError, TypeError):
        return {}
    definition = ast.parse(source).body[0]
    if not isinstance(definition, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}
    arguments = definition.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
    return {a.arg: ast.unparse(a.annotation) for a in every if a is not None and a.annotation is not None}


def _constructor_signature(cls: type, init: griffe.Function) -> None:
    """The parameters of an Equinox module's constructor annotated as its source writes them.

    Equinox replaces the annotation of each constructor parameter named like a field with a
    converter by the converter's (`Any` for modopt's hyperparameters), in a generated
    `__init__` and in a written one alike. A generated one shows the fields' annotations
    (`b1: Scalar`), a written one its own."""
    function = getattr(cls, "__init__", None)
    code = getattr(function, "__code__", None)
    if code is None or not dataclasses.is_dataclass(cls):
        return
    if code.co_filename == "<string>":  # generated by `dataclasses` from the fields
        written = _field_annotations(cls)
        owner = {f: next(k for k in cls.__mro__ if f in vars(k).get("__annotations__", {})) for f in written}
        namespaces = {f: vars(importlib.import_module(owner[f].__module__)) for f in written}
    else:
        written = _written_parameters(function)
        namespaces = dict.fromkeys(written, function.__globals__)
    for parameter in init.parameters:
        annotation = written.get(parameter.name)
        if annotation is None or annotation == "Any":
            continue
        try:
            node = ast.parse(annotation, mode="eval").body
        except SyntaxError:
            continue
        expression = griffe.safe_get_annotation(node, parent=init.parent)
        if expression is not None:
            _publish(expression, namespaces[parameter.name])
            parameter.annotation = expression


def _walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _annotations(obj: griffe.Object) -> Iterator[Any]:
    if isinstance(obj, griffe.Function):
        yield obj.returns
        for parameter in obj.parameters:
            yield parameter.annotation
    elif isinstance(obj, griffe.Attribute):
        yield obj.annotation


def private_paths(package: griffe.Module) -> list[str]:
    """Where a page would show a private path: `object: path` for each class base and each name
    of an annotation whose path has a part starting with `_`."""
    found = []
    for obj in _walk(package):
        if isinstance(obj, griffe.Class):
            found += [f"{obj.path} base: {base}" for base in obj.bases if _is_private(str(base))]
        for annotation in _annotations(obj):
            for name in _root_names(annotation):
                if name.parent is not None and _is_private(name.canonical_path):
                    found.append(f"{obj.path} annotation: {name.canonical_path}")
    return found


class ModoptDocs(griffe.Extension):
    def on_instance(self, *, node: Any, obj: griffe.Object, agent: Any, **kwargs: Any) -> None:
        value = node.obj if isinstance(node, griffe.ObjectNode) else None
        instance = value is not None and not (inspect.isclass(value) or inspect.isroutine(value) or inspect.ismodule(value))
        if instance:  # an attribute, or a callable instance (which griffe shows as a function)
            borrowed = inspect.getdoc(type(value))
            if obj.docstring is not None and inspect.cleandoc(obj.docstring.value) == borrowed:
                obj.docstring = None
            module_level = isinstance(getattr(agent, "current", None), griffe.Module)
            source = assignments().get(obj.name) if module_level else None
            if isinstance(obj, griffe.Attribute) and " object at 0x" in str(obj.value) and source:
                obj.value = source[0]  # `dataclasses.MISSING`, not a repr with an address
            if obj.docstring is None and module_level and obj.path.startswith("modopt"):
                docstring = assignments().get(obj.name, (None, None, None))[1]
                if docstring:
                    obj.docstring = griffe.Docstring(docstring, parent=obj)
        if obj.docstring is not None:
            obj.docstring.value = re.sub(r"^(\s*)Example:[ \t]*$", r"\1Examples:", obj.docstring.value, flags=re.M)

    def on_function_instance(self, *, node: Any, func: griffe.Function, agent: Any, **kwargs: Any) -> None:
        # `default=dataclasses.MISSING` (a required field) reads as its name, not as its repr
        # with a memory address.
        for parameter in func.parameters:
            if isinstance(parameter.default, str) and parameter.default.startswith("<dataclasses._MISSING_TYPE"):
                parameter.default = "MISSING"
        # A parameter annotated with a public alias shows the alias's name.
        try:
            signature = inspect.signature(node.obj)
        except (TypeError, ValueError):
            return
        aliases = _alias_names()
        for parameter in func.parameters:
            python = signature.parameters.get(parameter.name)
            if python is not None and id(python.annotation) in aliases:
                parameter.annotation = griffe.ExprName(aliases[id(python.annotation)], parent="modopt")

    def on_module_members(self, *, node: Any, mod: griffe.Module, agent: Any, **kwargs: Any) -> None:
        if not mod.path.startswith("modopt"):
            return
        for name, member in list(mod.members.items()):
            external = member.is_alias and member.target_path.split(".")[0] in ("typing", "collections")
            if external and name in assignments() and not name.startswith("_"):
                value, docstring, lineno = assignments()[name]
                alias = griffe.Attribute(name, value=value, lineno=lineno, endlineno=lineno)
                alias.labels.add("type alias")
                if docstring:
                    alias.docstring = griffe.Docstring(docstring, parent=alias)
                mod.set_member(name, alias)

    def on_class_members(self, *, node: Any, cls: griffe.Class, agent: Any, **kwargs: Any) -> None:
        init = cls.members.get("__init__")
        if isinstance(init, griffe.Alias) and init.target_path.startswith("typing."):
            del cls.members["__init__"]
        value = node.obj if isinstance(node, griffe.ObjectNode) else None
        if inspect.isclass(value) and issubclass(value, tuple) and hasattr(value, "_fields"):
            self._named_tuple_fields(value, cls)
        if inspect.isclass(value) and isinstance(cls.members.get("__init__"), griffe.Function):
            _constructor_signature(value, cls.members["__init__"])

    @staticmethod
    def _named_tuple_fields(value: type, cls: griffe.Class) -> None:
        """A state's fields (its checkpoint format) with their annotations, described by the
        comment after each (`count: jax.Array  # int32 scalar`), in place of inspection's
        "Alias for field number 0"."""
        try:
            lines, first = inspect.getsourcelines(value)
        except (OSError, TypeError):
            return
        for name in value._fields:  # re-added below in source order (rendering keeps dict order)
            cls.members.pop(name, None)
        body = ast.parse(inspect.cleandoc("".join(lines)) if lines[0][:1].isspace() else "".join(lines)).body[0]
        for statement in getattr(body, "body", []):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                name = statement.target.id
                if name not in value._fields:
                    continue
                line = lines[statement.lineno - 1]
                comment = line.split("#", 1)[1].strip() if "#" in line else None
                field = griffe.Attribute(name, lineno=first + statement.lineno - 1, endlineno=first + statement.lineno - 1)
                field.annotation = ast.unparse(statement.annotation)
                field.labels.add("field")
                if comment:
                    field.docstring = griffe.Docstring(comment[:1].upper() + comment[1:] + ".", parent=field)
                cls.set_member(name, field)

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "modopt" or "integrations" in pkg.members:
            return
        folder = _package_folder("modopt.integrations")
        integrations = self._inspect(loader, "integrations", folder / "__init__.py", pkg)
        for path in sorted(folder.glob("*.py")):
            if not path.name.startswith("_"):
                self._inspect(loader, path.stem, path, integrations)
        # Public paths, once every module is loaded (griffe resolves names across modules).
        for obj in _walk(pkg):
            if isinstance(obj, griffe.Class):
                obj.bases = _public_bases(list(obj.bases))
            for annotation in _annotations(obj):
                _publish(annotation)

    @staticmethod
    def _inspect(loader: griffe.GriffeLoader, name: str, path: Path, parent: griffe.Module) -> griffe.Module:
        module = griffe.inspect(
            name,
            filepath=path,
            import_paths=loader.finder.search_paths,
            parent=parent,
            extensions=loader.extensions,
            docstring_parser=loader.docstring_parser,
            docstring_options=loader.docstring_options,
            lines_collection=loader.lines_collection,
            modules_collection=loader.modules_collection,
        )
        parent.set_member(name, module)
        return module
