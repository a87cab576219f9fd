"""The adapter contract: one small base class every framework adapter implements.

An adapter turns a framework's own callbacks or tracing into OpenTelemetry spans written with the attribute
names of :mod:`agentlightning.semconv`. ``instrument()`` hooks the framework (only through its public callback or
tracing API), ``uninstrument()`` unhooks it; both are idempotent. Before hooking, the installed framework version
is checked against the adapter's ``SUPPORTED_RANGE`` and refused outside it.

Installed adapters announce themselves through the entry point group ``agentlightning.adapters`` (value: the
``Adapter`` subclass), so :func:`instrument_all` finds every one of them.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, Self, cast

from packaging.requirements import Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "ENTRY_POINT_GROUP",
    "Adapter",
    "UnsupportedVersionError",
    "get_adapter",
    "instrument_all",
    "supported_range",
    "uninstrument_all",
    "version_in_range",
]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agentlightning.adapters"


class UnsupportedVersionError(RuntimeError):
    """The installed framework is missing or outside the adapter's supported range; nothing was hooked."""


def version_in_range(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies a PEP 440 specifier set such as ``">=0.3,<2"``.

    Pre-releases count as installed versions (``1.0rc1`` is inside ``>=0.3,<2``), and PEP 440's ordering holds:
    ``2.0.0rc1`` is outside ``<2``.

    Raises:
        ValueError: ``spec`` or ``version`` cannot be parsed.
    """
    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion) as exc:
        raise ValueError(f"cannot check version {version!r} against {spec!r}: {exc}") from exc


def supported_range(distribution: str, framework: str) -> str:
    """The version range of ``framework`` that the installed ``distribution`` declares in its dependencies.

    An adapter keeps its supported range in one place, its ``pyproject.toml``, and reads it back here::

        SUPPORTED_RANGE = supported_range("agentlightning-langchain", "langchain-core")  # e.g. "<2,>=0.3"

    Raises:
        LookupError: ``distribution`` is not installed, or declares no dependency on ``framework``.
    """
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise LookupError(f"{distribution} is not installed, so its supported {framework} range is unknown") from exc
    wanted = canonicalize_name(framework)
    for line in requirements:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) == wanted and requirement.specifier:
            return str(requirement.specifier)
    raise LookupError(f"{distribution} declares no version range for {framework} in its dependencies")


class Adapter(ABC):
    """Base class of framework adapters.

    Subclasses set the class constants and implement ``_instrument`` / ``_uninstrument``; this class makes
    both idempotent, thread-safe and version-checked.

    Attributes:
        NAME: Short adapter name written on every span as ``agentlightning.adapter`` (e.g. ``"langchain"``).
        FRAMEWORK: Distribution name of the framework whose version is checked (e.g. ``"langchain-core"``).
        SUPPORTED_RANGE: Supported framework versions (a PEP 440 specifier), read from the adapter's own
            package metadata with `supported_range` so that pyproject.toml is the one place it is written.
        INSTALL: What to install to get a supported framework (shown when refusing).
        LOW_LEVEL: ``True`` for adapters of a raw client library (openai, litellm); :func:`instrument_all`
            skips them by default because framework adapters already record those calls.
    """

    NAME: ClassVar[str]
    FRAMEWORK: ClassVar[str]
    SUPPORTED_RANGE: ClassVar[str]
    INSTALL: ClassVar[str] = ""
    LOW_LEVEL: ClassVar[bool] = False

    _defaults: ClassVar[dict[type[Adapter], Adapter]] = {}
    _defaults_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._instrumented = False
        self.tracer_provider: TracerProvider | None = None
        """The provider given to the last `instrument` (``None``: the spans go through `lightning_provider`)."""

    @staticmethod
    def instances() -> list[Adapter]:
        """Every process-wide adapter instance created so far (through `default`)."""
        with Adapter._defaults_lock:
            return list(Adapter._defaults.values())

    @classmethod
    def default(cls) -> Self:
        """The process-wide instance of this adapter (what ``instrument_all`` and the one-liners use)."""
        with Adapter._defaults_lock:
            instance = Adapter._defaults.get(cls)
            if instance is None:
                instance = Adapter._defaults[cls] = cls()
            return cast(Self, instance)  # stored under its own class, so it is an instance of ``cls``

    @property
    def instrumented(self) -> bool:
        """Whether the framework is currently hooked by this adapter."""
        return self._instrumented

    @classmethod
    def installed_version(cls) -> str | None:
        """Installed version of ``FRAMEWORK``, or ``None`` when it is not installed."""
        try:
            return importlib.metadata.version(cls.FRAMEWORK)
        except importlib.metadata.PackageNotFoundError:
            return None

    @classmethod
    def check_version(cls, version: str | None = None) -> str:
        """Check the framework version (the installed one unless ``version`` is given) against the range.

        Returns:
            The checked version.

        Raises:
            UnsupportedVersionError: Not installed or outside ``SUPPORTED_RANGE``; the message names the exact
                versions and what to install.
        """
        found = cls.installed_version() if version is None else version
        install = cls.INSTALL or f"pip install '{cls.FRAMEWORK}{cls.SUPPORTED_RANGE}'"
        if found is None:
            raise UnsupportedVersionError(
                f"The {cls.NAME} adapter needs {cls.FRAMEWORK}{cls.SUPPORTED_RANGE}, which is not installed. "
                f"Install it with: {install}"
            )
        try:
            ok = version_in_range(found, cls.SUPPORTED_RANGE)
        except ValueError:
            ok = False
        if not ok:
            raise UnsupportedVersionError(
                f"The {cls.NAME} adapter supports {cls.FRAMEWORK}{cls.SUPPORTED_RANGE}, but {cls.FRAMEWORK}=={found} "
                f"is installed; nothing was instrumented. Install a supported version with: {install}"
            )
        return found

    def instrument(self, tracer_provider: TracerProvider | None = None) -> None:
        """Hook the framework. Calling it again while hooked does nothing.

        Args:
            tracer_provider: The OpenTelemetry SDK provider the adapter's spans go through, as OpenTelemetry's
                instrumentors take it (the rollouts' span processor is attached to it, so spans started inside a
                rollout are still stored). ``None``: Agent Lightning's own provider. No adapter sets the global
                provider.

        Raises:
            UnsupportedVersionError: The framework is missing or its version is outside ``SUPPORTED_RANGE``.
        """
        with self._lock:
            if self._instrumented:
                if tracer_provider is not None and tracer_provider is not self.tracer_provider:
                    logger.warning("%s is already instrumented; the new tracer_provider is ignored", self.NAME)
                return
            version = self.check_version()
            self.tracer_provider = tracer_provider
            self._instrument()
            self._instrumented = True
            logger.debug("instrumented %s (%s==%s)", self.NAME, self.FRAMEWORK, version)

    def uninstrument(self) -> None:
        """Unhook the framework; afterwards the adapter emits nothing. Calling it again does nothing."""
        with self._lock:
            if not self._instrumented:
                return
            self._uninstrument()
            self._instrumented = False
            logger.debug("uninstrumented %s", self.NAME)

    def pending(self) -> int:
        """Calls seen but not yet recorded (adapters whose framework reports calls late, e.g. LiteLLM)."""
        return 0

    async def adrain(self, timeout: float = 5.0) -> bool:
        """Wait until `pending` is 0 (the framework reported every call); call before flushing a rollout.

        Returns:
            ``True`` when nothing is pending, ``False`` when ``timeout`` passed first.
        """
        import asyncio
        import time

        deadline = time.monotonic() + timeout
        while self.pending() > 0:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    @abstractmethod
    def _instrument(self) -> None:
        """Hook the framework (called once per instrument cycle, version already checked)."""

    @abstractmethod
    def _uninstrument(self) -> None:
        """Undo ``_instrument``."""


def _entry_points(name: str | None = None) -> dict[str, type[Adapter]]:
    """The adapter classes registered in the entry point group (only those named ``name`` when given)."""
    found: dict[str, type[Adapter]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if name is not None and ep.name != name:
            continue
        try:
            cls = ep.load()
        except Exception as exc:  # a broken optional adapter must not break the others
            logger.warning("could not load adapter entry point %s (%s): %s", ep.name, ep.value, exc)
            continue
        if not (isinstance(cls, type) and issubclass(cls, Adapter)):
            logger.warning("entry point %s (%s) is not an Adapter subclass; skipped", ep.name, ep.value)
            continue
        found[ep.name] = cls
    return found


def get_adapter(name: str) -> Adapter:
    """The process-wide instance of the adapter registered under ``name``.

    Raises:
        KeyError: No installed adapter has that name (the message lists the installed ones).
    """
    classes = _entry_points(name)  # only that one: importing every adapter's framework costs seconds of CPU
    if name not in classes:
        installed = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
        raise KeyError(f"no adapter named {name!r} is installed; installed adapters: {installed}")
    return classes[name].default()


def instrument_all(
    *, include: list[str] | None = None, low_level: bool = False, tracer_provider: TracerProvider | None = None
) -> list[str]:
    """Instrument every installed adapter whose framework is installed in a supported version.

    Args:
        include: Only these adapter names (default: all found through the entry point group).
        low_level: Also instrument raw client adapters (``openai``, ``litellm``). Off by default because the
            framework adapters already record those calls.
        tracer_provider: Passed to every adapter's `Adapter.instrument`.

    An active span source (the app's own OpenLLMetry or OpenTelemetry GenAI instrumentation, see
    `agentlightning.adapters.SpanSource`) is used first, and our adapters for the same calls are then skipped, so
    each call is recorded once.

    Returns:
        Names of the adapters (and span sources) in use after the call. Adapters whose framework is missing or out
        of range are skipped: a missing framework with an INFO line, an installed one outside the supported range
        with a WARNING naming its version and the range (``get_adapter(name).instrument()`` raises instead).
    """
    from agentlightning.adapters._sources import SOURCES, use_active_sources

    # The app's own GenAI instrumentation (OpenLLMetry, OpenTelemetry's openai-v2) already records some calls: read
    # its spans, and do not hook the same calls a second time (``include`` naming our adapter still wins).
    sources = use_active_sources()
    covered = {name for cls in SOURCES if cls.NAME in sources for name in cls.COVERS}
    names = include if include is not None else sorted(_entry_points())
    done: list[str] = list(sources) if include is None else []
    for name in names:
        adapter = get_adapter(name)
        if adapter.LOW_LEVEL and not low_level and include is None:
            continue
        if name in covered and include is None:
            logger.info("adapter %s not instrumented: the app's own instrumentation already records its calls", name)
            continue
        try:
            adapter.instrument(tracer_provider)
        except UnsupportedVersionError as exc:
            version = adapter.installed_version()
            if version is None:  # the framework is not installed: nothing to instrument, nothing wrong
                logger.info("skipping adapter %s: %s", name, exc)
            else:
                logger.warning(
                    "adapter %s NOT instrumented: %s %s is installed but the adapter supports %s %s, so its calls "
                    "will not be traced. %s",
                    name,
                    adapter.FRAMEWORK,
                    version,
                    adapter.FRAMEWORK,
                    adapter.SUPPORTED_RANGE,
                    exc,
                )
            continue
        done.append(name)
    return done


def uninstrument_all() -> None:
    """Uninstrument every adapter's process-wide instance (those ``instrument_all`` and the one-liners use)."""
    for adapter in Adapter.instances():
        adapter.uninstrument()
