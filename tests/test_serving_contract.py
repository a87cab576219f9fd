"""One serving contract in both trainer packages, checked by reading their sources (``ast``; nothing is imported).

The engines (`agentlightning_torch.TorchEngine`, `agentlightning_verl.VerlEngine`) own inference servers of several
kinds; each package names what it needs from them in one ``Serving`` protocol with the same steps (`STEPS`), one
implementation per way of serving, and the engine delegates every server step to the one its factory picked:

* each trainer package defines exactly one ``Serving`` protocol, and the shared steps have the same names and
  parameters in both;
* every ``...Serving`` class of a package has every step of its package's protocol (itself or through a base);
* the step "wait until the servers generate nothing" has one name (``drain``; ``drain_servers`` is core's `Engine`
  step that calls it); a deprecated old spelling that only warns is allowed;
* no class name is used twice across the trainer packages (ignoring case and underscores: ``VLLMServing`` and
  ``VllmServing`` were two different things), the shared ``Serving`` protocol excepted;
* the engines choose their serving in one factory and delegate: no ``if``, ``getattr``/``hasattr`` probing or
  ``asyncio.run`` in their server steps.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "trainer-torch": ROOT / "packages/trainer-torch/src/agentlightning_torch",
    "trainer-verl": ROOT / "packages/trainer-verl/src/agentlightning_verl",
}
ENGINES = {"trainer-torch": ("training/_trainer.py", "TorchEngine"), "trainer-verl": ("_engine.py", "VerlEngine")}
STEPS = ("start", "drain", "sync", "metrics", "stop")
"""The serving steps both packages share (a package's protocol may add its own, e.g. verl's ``release``)."""
ENGINE_STEPS = {
    "start_servers": "start",
    "drain_servers": "drain",
    "sync_weights": "sync",
    "iteration_metrics": "metrics",
    "stop_servers": "stop",
}
"""Core's `Engine` server steps and the serving step each delegates to."""


def _modules(package: str) -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGES[package].rglob("*.py"))}


def _classes(package: str) -> dict[str, ast.ClassDef]:
    return {
        node.name: node
        for tree in _modules(package).values()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def _base_names(cls: ast.ClassDef) -> list[str]:
    return [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "" for b in cls.bases]


def _is_protocol(cls: ast.ClassDef) -> bool:
    return "Protocol" in _base_names(cls)


def _methods(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods ``cls`` defines or inherits from classes of the same package (bases first, own ones win)."""
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for base in _base_names(cls):
        if base in classes and base != cls.name:
            found.update(_methods(classes[base], classes))
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = node
    return found


def _signature(method: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[bool, list[str]]:
    """``(async, parameter names)``: what a caller relies on."""
    return isinstance(method, ast.AsyncFunctionDef), [a.arg for a in [*method.args.args, *method.args.kwonlyargs]]


def _protocol(package: str) -> ast.ClassDef:
    found = [c for c in _classes(package).values() if c.name == "Serving" and _is_protocol(c)]
    assert len(found) == 1, f"{package} should define one Serving protocol, found {len(found)}"
    return found[0]


def _is_deprecated(method: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the method warns with a `DeprecationWarning` (an old spelling kept for a release)."""
    return any(isinstance(n, ast.Name) and n.id == "DeprecationWarning" for n in ast.walk(method))


def test_each_trainer_package_has_one_serving_protocol_with_the_same_steps() -> None:
    signatures: dict[str, dict[str, tuple[bool, list[str]]]] = {}
    for package in PACKAGES:
        methods = _methods(_protocol(package), _classes(package))
        missing = [step for step in STEPS if step not in methods]
        assert missing == [], f"{package}'s Serving protocol lacks the steps {missing}"
        signatures[package] = {step: _signature(methods[step]) for step in STEPS}
    torch_steps, verl_steps = signatures.values()
    assert torch_steps == verl_steps, f"the shared steps differ: {signatures}"


def test_every_serving_implementation_has_every_step_of_its_protocol() -> None:
    for package in PACKAGES:
        classes = _classes(package)
        protocol = _methods(_protocol(package), classes)
        implementations = [
            c
            for name, c in classes.items()
            if name.endswith("Serving") and not name.startswith("_") and not _is_protocol(c)
        ]
        assert implementations, f"{package} has no Serving implementation"
        for cls in implementations:
            methods = _methods(cls, classes)
            wrong = {
                step: _signature(methods[step]) if step in methods else None
                for step, declared in protocol.items()
                if not step.startswith("_")
                and (step not in methods or _signature(methods[step]) != _signature(declared))
            }
            assert wrong == {}, f"{package}: {cls.name} does not implement Serving's steps as declared: {wrong}"


def test_the_drain_step_has_one_name_across_the_trainer_packages() -> None:
    wrong: list[str] = []
    for package in PACKAGES:
        for path, tree in _modules(package).items():
            for node in ast.walk(tree):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                name = node.name.lower()
                named = ("drain" in name or "idle" in name) and name not in ("drain", "drain_servers", "_drain")
                if named and not _is_deprecated(node):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    assert wrong == [], (
        "the step 'wait until the servers are idle' is called `drain` (core's Engine: drain_servers):\n"
        + ("\n".join(wrong))
    )


def _key(name: str) -> str:
    return name.replace("_", "").lower()


def test_no_class_name_is_used_by_both_trainer_packages() -> None:
    torch_names = {_key(n): n for n in _classes("trainer-torch") if not n.startswith("_")}
    verl_names = {_key(n): n for n in _classes("trainer-verl") if not n.startswith("_")}
    shared = sorted(
        f"{torch_names[k]} (trainer-torch) / {verl_names[k]} (trainer-verl)"
        for k in torch_names.keys() & verl_names.keys()
        if k != "serving"
    )
    assert shared == [], "classes of the same (or nearly the same) name in both trainer packages:\n" + "\n".join(shared)


def _engine(package: str) -> ast.ClassDef:
    module, name = ENGINES[package]
    tree = ast.parse((PACKAGES[package] / module).read_text(encoding="utf-8"))
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _calls(node: ast.AST) -> list[str]:
    """Dotted names of the calls in ``node`` (``self.serving.drain``, ``asyncio.run``, ``getattr``)."""
    names: list[str] = []
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        parts: list[str] = []
        func: ast.expr = call.func
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if isinstance(func, ast.Name):
            parts.append(func.id)
        names.append(".".join(reversed(parts)))
    return names


def test_the_engines_delegate_every_server_step_to_their_serving() -> None:
    for package in PACKAGES:
        engine = _engine(package)
        methods = {n.name: n for n in engine.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        for step, serving_step in ENGINE_STEPS.items():
            assert step in methods, f"{engine.name} does not implement {step}"
            method = methods[step]
            branches = [n.lineno for n in ast.walk(method) if isinstance(n, ast.If | ast.IfExp | ast.Match)]
            assert branches == [], f"{engine.name}.{step} branches (lines {branches}): the serving picked once decides"
            assert any(c.endswith(f"serving.{serving_step}") for c in _calls(method)), (
                f"{engine.name}.{step} does not call its serving's {serving_step}"
            )


def test_the_engines_neither_probe_attributes_nor_start_event_loops() -> None:
    for package in PACKAGES:
        engine = _engine(package)
        wrong = [c for c in _calls(engine) if c in ("getattr", "hasattr", "asyncio.run")]
        assert wrong == [], f"{engine.name} calls {wrong}: use the Serving protocol, and the running event loop"
