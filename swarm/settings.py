"""Typed settings declared once, and the registries that make adding a thing one module.

- :class:`Section`: the base of every config section (pydantic, frozen, unknown keys refused).
- :func:`derive`: a section whose fields *are* a constructor's (or dataclass's) parameters, with
  their types, defaults and ``Annotated`` constraints; a setting is written once, in the signature.
- :class:`Registry`: one extension point (policy backends, reward kinds, pool engines). A module
  declares its section with ``@REGISTRY.declare("kind")`` and the section's ``build`` is the
  factory. A built-in kind ``k`` lives in module ``<home>.<k>``; any other kind is a dotted module
  path that declares itself (``@BACKENDS.declare(__name__)``), so a plugin needs no edit here. A
  section holds other kinds' sections (a fleet's replicas) as ``Annotated[Base, Kinds(REG, exclude=...)]``.

Nothing here reads config files or knows a concrete kind; :mod:`swarm.explain` turns validation
errors into messages. The schema of a run (``flows/schema.py``) asks the registries for their
unions (:meth:`Registry.union`) once the kinds a config names are loaded (:meth:`Registry.load`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import threading
from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from swarm.errors import ConfigError

__all__ = ["Section", "derive", "Registry", "Kinds"]

S = TypeVar("S", bound="Section")


class Section(BaseModel):
    """A config section: frozen, unknown keys refused (the message suggests the close one)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    derived: ClassVar[tuple[str, ...]] = ()  # the fields :func:`derive` took from the target's signature
    target: ClassVar[Any] = None  # what :func:`derive` read them from (the class the section builds)

    def args(self) -> dict[str, Any]:
        """The derived fields' values: the keyword arguments of the constructor they came from."""
        return {name: getattr(self, name) for name in self.derived}


def _parameters(target: Any) -> dict[str, tuple[Any, Any]]:
    """name -> (annotation with extras, default or ``...``) of a class's ``__init__`` or a dataclass's fields."""
    if dataclasses.is_dataclass(target):
        hints = get_type_hints(target, include_extras=True)
        out = {}
        for f in dataclasses.fields(target):
            if not f.init:
                continue
            default = (f.default if f.default is not dataclasses.MISSING else
                       Field(default_factory=f.default_factory) if f.default_factory is not dataclasses.MISSING
                       else ...)
            out[f.name] = (hints[f.name], default)
        return out
    init = target.__init__ if isinstance(target, type) else target
    hints = get_type_hints(init, include_extras=True)
    out = {}
    for name, p in inspect.signature(init).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out[name] = (hints.get(name, Any), ... if p.default is p.empty else p.default)
    return out


def derive(target: Any, *, skip: Iterable[str] = (), base: type[S] = Section, name: str | None = None) -> type[S]:
    """A :class:`Section` subclass of ``base`` with one field per parameter of ``target`` (a class, whose
    ``__init__`` is read, or a dataclass) except ``skip``; its :meth:`Section.args` are those fields.

    Subclass the result to add config-only fields (``backend: Literal[...]`` is added by the registry)."""
    skipped = set(skip)
    params = {n: v for n, v in _parameters(target).items() if n not in skipped and n not in base.model_fields}
    cls = create_model(name or f"{getattr(target, '__name__', 'Target')}Section", __base__=base,
                       __module__=getattr(target, "__module__", __name__), **params)  # type: ignore[call-overload]
    cls.derived = (*base.derived, *params)
    cls.target = target
    return cls


class Registry:
    """The kinds of one extension point: kind -> its :class:`Section` (whose ``build`` is the factory).

    ``point`` is the config key that holds such a section (``model``) and ``key`` its discriminator
    field (``backend``); ``home`` is the package of the built-in kinds (``swarm.policy``).
    """

    def __init__(self, point: str, key: str, home: str, base: type[Section] = Section) -> None:
        self.point, self.key, self.home, self.base = point, key, home, base
        self._kinds: dict[str, type[Section]] = {}
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.RLock()

    def declare(self, kind: str) -> Callable[[type[S]], type[S]]:
        """Class decorator: ``cls`` (a ``base`` subclass with a ``build`` method) is the section of ``kind``;
        the registry adds the ``<key>: Literal[kind]`` field that tells the kinds apart."""

        def register(cls: type[S]) -> type[S]:
            if not issubclass(cls, self.base):
                raise TypeError(f"{cls.__name__} must subclass {self.base.__name__} to be a {self.point} kind")
            tagged = create_model(cls.__name__, __base__=cls, __module__=cls.__module__, __doc__=cls.__doc__,
                                  **{self.key: (Literal[kind], ...)})  # type: ignore[call-overload]
            tagged.__qualname__ = cls.__qualname__
            with self._lock:
                self._kinds[kind] = tagged
                for other in self._kinds.values():  # sections holding kinds (a fleet's replicas) take the new one
                    if other is not tagged and any(isinstance(m, Kinds) for f in other.model_fields.values()
                                                   for m in _metadata(f.annotation)):
                        other.model_rebuild(force=True)
                listeners = list(self._listeners)
            for listener in listeners:
                listener()
            return tagged  # type: ignore[return-value]

        return register

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each new declaration (a schema rebuilds its unions)."""
        self._listeners.append(listener)

    def get(self, kind: str) -> type[Section]:
        """The section of ``kind``, importing the module that declares it (ConfigError names the point)."""
        if kind not in self._kinds:
            self.load([kind])
        return self._kinds[kind]

    def load(self, kinds: Iterable[str], key: str | None = None) -> None:
        """Import the modules that declare ``kinds``: ``<home>.<kind>``, or ``kind`` itself if dotted (``key``:
        the dotted config key that named them, for messages; default ``<point>.<key>``)."""
        key = key or f"{self.point}.{self.key}"
        for kind in kinds:
            if kind in self._kinds:
                continue
            module = kind if "." in kind else f"{self.home}.{kind}"
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name is None or not module.startswith(exc.name):  # a missing dependency, not a missing kind
                    raise ConfigError(f"{key}={kind}: importing {module} failed: {exc}") from None
            if kind not in self._kinds:
                raise ConfigError(f"{key}={kind}: unknown; use one of {', '.join(self.builtins())}"
                                  f" (or a module path that declares its own {self.point} kind)")

    def builtins(self) -> list[str]:
        """The built-in kinds: those the public modules of ``home`` declare (imports them)."""
        home = importlib.import_module(self.home)
        for info in pkgutil.iter_modules(home.__path__):
            if not info.name.startswith("_"):
                try:
                    importlib.import_module(f"{self.home}.{info.name}")
                except ImportError:  # an optional dependency of a non-kind module: it declares nothing usable
                    continue
        return sorted(k for k, cls in self._kinds.items() if cls.__module__.startswith(self.home + "."))

    def kinds(self) -> dict[str, type[Section]]:
        """The kinds declared so far (kind -> section)."""
        return dict(self._kinds)

    def union(self, exclude: Iterable[str] = ()) -> Any:
        """The declared sections as one pydantic union, told apart by ``key`` (a schema's field type)."""
        members = tuple(cls for kind, cls in self._kinds.items() if kind not in set(exclude))
        if not members:  # none declared yet: only the base (whose missing tag fails); a declaration rebuilds
            return self.base
        if len(members) == 1:
            return members[0]
        return Annotated[Union[members], Field(discriminator=self.key)]  # noqa: UP007


@dataclasses.dataclass(frozen=True)
class Kinds:
    """``Annotated`` marker: the field holds a section of any kind of ``registry`` declared so far (but
    ``exclude``); its schema is made when the holder's is, so a kind declared later joins on rebuild."""

    registry: Registry
    exclude: tuple[str, ...] = ()

    def members(self) -> list[type[Section]]:
        """The sections this field may hold now."""
        return [cls for kind, cls in self.registry.kinds().items() if kind not in self.exclude]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return handler.generate_schema(self.registry.union(exclude=self.exclude))


def _metadata(annotation: Any) -> list[Any]:
    """The ``Annotated`` metadata anywhere inside ``annotation`` (``list[Annotated[X, m]]`` included)."""
    out = list(getattr(annotation, "__metadata__", ()))
    for arg in get_args(annotation):
        out += _metadata(arg)
    return out
