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
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import re
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
