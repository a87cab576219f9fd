"""One route table per server: each route is declared once, and both its dispatch and its OpenAPI entry come from it.

The store server and the LLM proxy answer their hot routes in plain ASGI (a framework's routing, dependency
solving and middleware cost more CPU per request than the work itself). A `Route` says everything about one
operation: method, path, handler, request and response models, the errors it documents and who may call it.
`RouteTable` matches requests against the routes (a dict lookup for fixed paths), and `openapi_document` writes the
OpenAPI 3.1 document from the same routes, so what is served and what is documented cannot drift apart.

Paths are literal segments plus parameters: ``{name}`` takes one segment, ``{name:path}`` (last only) takes the rest
of the path, slashes included.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple
from urllib.parse import unquote

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

__all__ = ["OPEN", "Match", "Route", "RouteTable", "openapi_document"]

OPEN = "open"
"""The auth rule of a route served to anyone (no token)."""

Method = Literal["GET", "POST", "PUT", "DELETE"]
_PARAM = re.compile(r"^\{([A-Za-z_][A-Za-z0-9_]*)(:path)?\}$")


@dataclass(frozen=True, slots=True)
class Route:
    """One operation of a server: how it is answered and how it is documented.

    Attributes:
        method: ``GET``, ``POST``, ``PUT`` or ``DELETE`` (``HEAD`` is answered as ``GET``).
        path: The path template, e.g. ``/v1/rollouts/{rollout_id:path}``.
        handler: Called with the route's input (what that is belongs to the server: the parsed body, the path
            parameters...); returns the server's answer.
        name: The operation id in the OpenAPI document (unique per table).
        doc: What the operation does (its description in the document; the first sentence is its summary).
        body: The request body model (``None``: no body).
        response: The model of a 200 answer (``None``: not JSON, or nothing to describe).
        errors: Error statuses this operation documents besides the table's common ones, with their meaning.
        tags: Groups in the document.
        auth: The name of the rule that admits a caller: `OPEN`, or one the server defines (``"bearer"``...).
        documented: ``False`` keeps the route out of the document (static files, redirects).
        read: A faster reader of the usual body than the model's validation: the body's model, or ``None`` to
            have the model validate the body (and word any refusal). It must accept only what the model accepts.
    """

    method: Method
    path: str
    handler: Callable[[Any], Awaitable[Any]]
    name: str
    doc: str
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    errors: Mapping[int, str] = field(default_factory=dict[int, str])
    tags: tuple[str, ...] = ()
    auth: str = "bearer"
    documented: bool = True
    read: Callable[[bytes], Any] | None = None
    segments: tuple[str, ...] = field(init=False, repr=False, compare=False)
    params: tuple[str, ...] = field(init=False, repr=False, compare=False)
    rest: bool = field(init=False, repr=False, compare=False)
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"route path must start with '/', got {self.path!r}")
        segments = tuple(self.path.split("/")[1:])
        params: list[str] = []
        rest = False
        regex: list[str] = []
        for index, segment in enumerate(segments):
            found = _PARAM.match(segment)
            if found is None:
                if "{" in segment or "}" in segment:
                    raise ValueError(f"route {self.path!r}: a parameter must be a whole segment, got {segment!r}")
                regex.append(re.escape(segment))
                continue
            params.append(found.group(1))
            if found.group(2):
                if index != len(segments) - 1:
                    raise ValueError(f"route {self.path!r}: only the last parameter may be a {{name:path}}")
                rest = True
                regex.append("(.*)")  # the rest of the path, slashes included
            else:
                regex.append("([^/]+)")  # one segment, never empty
        object.__setattr__(self, "segments", segments)
        object.__setattr__(self, "params", tuple(params))
        object.__setattr__(self, "rest", rest)
        object.__setattr__(self, "pattern", re.compile("/" + "/".join(regex)))

    @property
    def openapi_path(self) -> str:
        """The path as the document writes it (``{name}`` for every parameter)."""
        return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*):path\}", r"{\1}", self.path)

    def match(self, path: str, decode: bool) -> dict[str, str] | None:
        """The path parameters when ``path`` fits this route's template (decoded with ``decode``), else ``None``."""
        found = self.pattern.fullmatch(path)
        if found is None:
            return None
        if decode:
            return {name: unquote(value) for name, value in zip(self.params, found.groups(), strict=True)}
        return dict(zip(self.params, found.groups(), strict=True))


class Match(NamedTuple):
    """A request's route and its path parameters (`RouteTable.match`)."""

    route: Route
    params: dict[str, str]


class RouteTable:
    """The routes of one server, matched by method and path.

    Args:
        routes: Every route; a (method, path) pair and an operation name may appear once.
        decode: Percent-decode parameter values after splitting. Give the raw request path then, so that an
            encoded ``/`` (``%2F``) stays inside one parameter; without it, match the decoded path.
    """

    def __init__(self, routes: Iterable[Route], decode: bool = False) -> None:
        self.routes: tuple[Route, ...] = tuple(routes)
        self.decode = decode
        self._fixed: dict[tuple[str, str], Match] = {}
        self._templated: list[Route] = []
        self._paths: dict[str, Route] = {}
        seen: set[tuple[str, str]] = set()
        names: set[str] = set()
        for route in self.routes:
            key = (route.method, route.path)
            if key in seen:
                raise ValueError(f"route {route.method} {route.path} is declared twice")
            if route.name in names:
                raise ValueError(f"operation name {route.name!r} is used twice")
            seen.add(key)
            names.add(route.name)
            if route.params:
                self._templated.append(route)
            else:
                self._fixed[key] = Match(route, {})  # made once: a fixed path's match never changes
                self._paths.setdefault(route.path, route)

    def match(self, method: str, path: str) -> Match | None:
        """The route answering ``method path``, or ``None`` (see `allowed` for a path known under another method)."""
        found = self._fixed.get((method, path))
        if found is not None or not self._templated:
            return found
        for route in self._templated:
            if route.method == method:
                params = route.match(path, self.decode)
                if params is not None:
                    return Match(route, params)
        return None

    def methods(self, path: str) -> list[str]:
        """The methods served at ``path`` (for the ``Allow`` header of a 405; ``HEAD`` wherever ``GET`` is)."""
        found = {route.method for route in self.routes if route.match(path, self.decode) is not None}
        if "GET" in found:
            found.add("HEAD")
        return sorted(found)

    def allowed(self, path: str) -> Route | None:
        """A route at ``path`` under any method (the request's method is then not allowed there), or ``None``."""
        route = self._paths.get(path)
        if route is not None:
            return route
        for route in self._templated:
            if route.match(path, self.decode) is not None:
                return route
        return None


def openapi_document(
    routes: Iterable[Route],
    *,
    title: str,
    version: str,
    description: str,
    error_model: type[BaseModel],
    common_errors: Mapping[int, str],
    security: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes``.

    Args:
        routes: The table's routes (those with ``documented=False`` are left out).
        title: The API's title.
        version: The API's version.
        description: What the API is.
        error_model: The body of every error answer.
        common_errors: Errors any operation may answer: ``401`` (listed on routes behind an enforced rule), ``413``
            and ``422`` (listed on routes with a body), others on every route.
        security: Enforced auth rules: rule name -> OpenAPI security scheme. Routes behind one of them list it;
            rules not given here (no token configured) are documented as open.
    """
    documented = [route for route in routes if route.documented]
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [(error_model, "serialization")]
    for route in documented:
        if route.body is not None:
            wanted.append((route.body, "validation"))
        if route.response is not None:
            wanted.append((route.response, "serialization"))
    refs, definitions = models_json_schema(list(dict.fromkeys(wanted)), ref_template="#/components/schemas/{model}")
    error_ref = refs[(error_model, "serialization")]

    def answer(text: str, schema: Mapping[str, Any] | None) -> dict[str, Any]:
        if schema is None:
            return {"description": text}
        return {"description": text, "content": {"application/json": {"schema": dict(schema)}}}

    paths: dict[str, dict[str, Any]] = {}
    for route in documented:
        summary, _, _ = route.doc.partition(". ")
        operation: dict[str, Any] = {
            "tags": list(route.tags),
            "summary": summary.rstrip("."),
            "description": route.doc,
            "operationId": route.name,
        }
        if route.params:
            operation["parameters"] = [
                {"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in route.params
            ]
        if route.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(route.body, "validation")]}},
            }
        ok = None if route.response is None else refs[(route.response, "serialization")]
        responses: dict[str, Any] = {"200": answer("Successful Response", ok)}
        guarded = route.auth in security
        for status, text in sorted({**common_errors, **route.errors}.items()):
            if status == 401 and not guarded:
                continue
            if status in (413, 422) and route.body is None and status not in route.errors:
                continue
            responses[str(status)] = answer(text, error_ref)
        operation["responses"] = responses
        if guarded:
            operation["security"] = [{route.auth: []}]
        paths.setdefault(route.openapi_path, {})[route.method.lower()] = operation
    components: dict[str, Any] = {"schemas": definitions.get("$defs", {})}
    if security:
        components["securitySchemes"] = {name: dict(scheme) for name, scheme in security.items()}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "description": description, "version": version},
        "paths": paths,
        "components": components,
    }
