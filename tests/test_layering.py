"""The import arrows point one way: settings -> loader -> engine -> runs -> metrics -> charts / API -> page.

Read from the code itself (every `import` of every module), anchored on the repository root, so the test checks
the same files from whatever folder it is run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("config", "model", "training", "batching", "utils", "app")
OURS = ("config", "model", "training", "batching", "utils", "app", "streamlit_app")
PAGE = ("streamlit_app", "app")  # the frame and the package of its views
# One folder per view (its page script, its run, its state, its sections); what several share is in `app.common`.
FEATURES = ("app.race", "app.shared_engine", "app.remote", "app.sweep")
COMMON = "app.common"
# The page's own models, tested without Streamlit: the queue, a run's follower, a run's live view, the streaming
# loop, a race's lanes and its loop, a sweep's view (of this tab's engine, and of running servers).
PAGE_MODELS = (
    "app.common.prompt_queue",
    "app.common.baton",
    "app.common.live_run",
    "app.common.streaming",
    "app.race.lanes",
    "app.race.stream",
    "app.sweep.live_sweep",
    "app.sweep.live_server_sweep",
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _project_modules() -> dict[str, Path]:
    files = [ROOT / "streamlit_app.py"]
    for folder in SOURCE_DIRS:
        files += sorted((ROOT / folder).rglob("*.py"))
    return {_module_name(path): path for path in files}


def _imports(path: Path) -> set[str]:
    """Every module of ours that `path` imports, at any depth of the file (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name.split(".")[0] in OURS)
    return found


MODULES = _project_modules()
GRAPH = {name: {imp for imp in _imports(path) if imp in MODULES} for name, path in MODULES.items()}


def _unit(module: str) -> str:
    """The layer a module belongs to: the engine core, the bench and the service are units of their own."""
    for unit in ("batching.engine", "batching.bench", "batching.service", "batching.serve", "batching.remote"):
        if module == unit or module.startswith(unit + "."):
            return unit
    if module in ("batching.arrivals", "batching.runs", "batching.race", "batching.sweep"):
        return "batching.runs"
    if module.startswith("utils."):  # a sub-package (metrics, charts) or a module of its own (export, plain_text)
        return ".".join(module.split(".")[:2])
    return module.split(".")[0]


def _is_page(module: str) -> bool:
    return module.split(".")[0] in PAGE


def _imported_modules(path: Path, package: str) -> set[str]:
    """The modules of `package` (a third party's) that `path` imports, at any depth of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return {name for name in imported if name.split(".")[0] == package}


def _streamlit_imports(path: Path) -> set[str]:
    return _imported_modules(path, "streamlit")


def test_the_layering_test_sees_the_project() -> None:
    assert len(MODULES) > 30, f"found only {len(MODULES)} modules under {ROOT}"
    assert "batching.engine.batcher" in MODULES and "streamlit_app" in MODULES
    assert {"training.train", "training.corpus", "training.evaluate", "model.loader"} <= set(MODULES)
    assert {*(f"{feature}.page" for feature in FEATURES), "app.common.queue", *PAGE_MODELS} <= set(MODULES)


# The names of the engine's choices (block sizes, policies, admissions), defined once where the settings and the
# engine can both import them: plain values, importing nothing.
CHOICES = "config.choices"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _unit(m) == "batching.engine"))
def test_the_engine_core_imports_nothing_else_of_ours_but_the_names_of_its_choices(module: str) -> None:
    outside = {imp for imp in GRAPH[module] if _unit(imp) != "batching.engine" and imp != CHOICES}
    assert not outside, f"{module} imports {sorted(outside)}"


def test_the_names_of_the_choices_import_nothing() -> None:
    tree = ast.parse(MODULES[CHOICES].read_text(encoding="utf-8"))
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _unit(m) == "config"))
def test_config_imports_nothing_of_ours(module: str) -> None:
    assert {imp for imp in GRAPH[module] if _unit(imp) != "config"} == set()


def test_nothing_below_the_page_imports_it_or_streamlit() -> None:
    for module, path in MODULES.items():
        if _is_page(module):
            continue
        page = {imp for imp in GRAPH[module] if _is_page(imp)}
        assert not page, f"{module} imports the page: {sorted(page)}"
        assert not _streamlit_imports(path), f"{module} imports streamlit"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _unit(m).startswith("utils")))
def test_utils_never_imports_the_page(module: str) -> None:
    assert not {imp for imp in GRAPH[module] if _is_page(imp)}, f"{module} imports the page"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _unit(m) in ("utils.metrics", "utils.export")))
def test_the_metrics_and_the_export_draw_nothing(module: str) -> None:
    """Frames and figures are computed in `utils.metrics`; only `utils.charts` turns them into altair charts."""
    assert not _imported_modules(MODULES[module], "altair"), f"{module} imports altair"


@pytest.mark.parametrize("module", PAGE_MODELS)
def test_the_pages_models_import_no_streamlit(module: str) -> None:
    assert not _streamlit_imports(MODULES[module]), f"{module} imports streamlit"
    assert not {imp for imp in GRAPH[module] if _unit(imp) == "app" and imp not in PAGE_MODELS}


def test_the_page_package_never_imports_the_frame() -> None:
    for module in (m for m in MODULES if _unit(m) == "app"):
        assert "streamlit_app" not in GRAPH[module], module


def test_no_module_imports_a_view() -> None:
    """A view is a script the frame runs through st.navigation (each folder's `page`): importing it would draw it."""
    pages = {f"{feature}.page" for feature in FEATURES}
    for module, imports in GRAPH.items():
        views = imports & pages
        assert not views, f"{module} imports {sorted(views)}"


def _feature(module: str) -> str | None:
    """The view's folder a module of the page belongs to (None: `app.common`, the package, or not the page)."""
    return next((f for f in FEATURES if module == f or module.startswith(f + ".")), None)


def test_every_module_of_the_page_is_in_a_views_folder_or_the_common_one() -> None:
    loose = [m for m in MODULES if m.startswith("app.") and not _feature(m) and not m.startswith(COMMON)]
    assert not loose, f"modules of app/ outside a view's folder and app/common: {loose}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _unit(m) == "app"))
def test_a_views_folder_imports_no_other_views_and_the_common_pieces_import_none(module: str) -> None:
    """Each view's folder stands on `app.common` alone, so a view is read, changed or removed in its own folder."""
    others = {imp for imp in GRAPH[module] if _feature(imp) not in (None, _feature(module))}
    assert not others, f"{module} imports {sorted(others)}"


# Which units may import which: a unit never imports one that comes after it in the flow (the page may import all).
ORDER = [
    "config",
    "model",
    "training",
    "batching.engine",
    "batching.runs",
    "batching.remote",
    "utils.log_setup",
    "utils.plain_text",
    "utils.metrics",
    "utils.charts",
    "utils.export",
    "batching.service",
    "batching.serve",
    "batching.bench",
    "app",
    "streamlit_app",
]


def test_units_import_only_units_before_them() -> None:
    rank = {unit: index for index, unit in enumerate(ORDER)}
    for module, imports in GRAPH.items():
        unit = _unit(module)
        if unit not in rank:
            continue
        later = {imp for imp in imports if _unit(imp) in rank and rank[_unit(imp)] > rank[unit]}
        assert not later, f"{module} ({unit}) imports {sorted(later)}, which come after it"


def test_nothing_of_ours_imports_the_training_and_it_imports_only_the_settings_and_the_loader() -> None:
    """The embedded model's training is a tool that writes model/builtin: the app, engine and server only load it."""
    for module, imports in GRAPH.items():
        if _unit(module) == "training":
            assert {_unit(imp) for imp in imports} <= {"training", "model", "config"}, module
        else:
            assert not {imp for imp in imports if _unit(imp) == "training"}, module


def test_there_are_no_import_cycles_between_modules() -> None:
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in done:
            return
        assert module not in visiting, "import cycle: " + " -> ".join([*path, module])
        visiting.add(module)
        for imported in sorted(GRAPH[module]):
            visit(imported, [*path, module])
        visiting.discard(module)
        done.add(module)

    for module in sorted(GRAPH):
        visit(module, [])


# The engine client is made of one part per job; each part imports only the parts before it, the client all of them.
CLIENT_PARTS = [
    "batching.service.handles",
    "batching.service.lifecycle",
    "batching.service.routing",
    "batching.service.admission",
    "batching.service.private",
    "batching.service.client",
]


@pytest.mark.parametrize("index", range(len(CLIENT_PARTS)), ids=CLIENT_PARTS)
def test_each_part_of_the_engine_client_imports_only_the_parts_before_it(index: int) -> None:
    module = CLIENT_PARTS[index]
    later = GRAPH[module] & set(CLIENT_PARTS[index + 1 :])
    assert not later, f"{module} imports {sorted(later)}, which come after it"


def test_the_engine_client_is_composed_of_every_part() -> None:
    assert set(CLIENT_PARTS[:-1]) <= GRAPH["batching.service.client"]


# A step's run: what it computes (its inputs, then the builders), how it is called, how its graphs are made off the
# serving path, then the runner that dispatches. Each part imports only the parts before it; the builders never
# know how a step runs (nor the compiler), and the caller never builds one.
STEP_PARTS = [
    "batching.engine.step_inputs",
    "batching.engine.step_builder",
    "batching.engine.step_call",
    "batching.engine.warmup",
    "batching.engine.runner",
]
HOW_STEPS_RUN = {
    "batching.engine.compiled",
    "batching.engine.cuda_graphs",
    "batching.engine.torch_gate",
    "batching.engine.public_route",
    "batching.engine.torch_door",
    "batching.engine.torch_door.direct_call",
}


@pytest.mark.parametrize("index", range(len(STEP_PARTS)), ids=STEP_PARTS)
def test_each_part_of_a_step_imports_only_the_parts_before_it(index: int) -> None:
    module = STEP_PARTS[index]
    later = GRAPH[module] & set(STEP_PARTS[index + 1 :])
    assert not later, f"{module} imports {sorted(later)}, which come after it"


@pytest.mark.parametrize("module", STEP_PARTS[:2])
def test_what_a_step_computes_knows_nothing_of_how_it_runs(module: str) -> None:
    assert not GRAPH[module] & HOW_STEPS_RUN, f"{module} imports {sorted(GRAPH[module] & HOW_STEPS_RUN)}"


def test_how_a_step_runs_never_builds_one() -> None:
    assert "batching.engine.step_builder" not in GRAPH["batching.engine.step_call"]


# The door to torch's internals: only its gate opens it, and only inside a function (when compiled steps are asked
# for on the torch it was checked on), so nothing that imports the engine imports torch's private modules with it.
DOOR = "batching.engine.torch_door"
DOOR_GATE = "batching.engine.torch_gate"


def _top_level_imports(path: Path) -> set[str]:
    """The modules `path` imports at its top level (not inside a function or class)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return found


def _is_door(module: str) -> bool:
    return module == DOOR or module.startswith(DOOR + ".")


def test_nothing_outside_the_door_imports_it_but_its_gate_and_the_gate_only_when_asked() -> None:
    helpers = ROOT / "tests" / "engine" / "helpers.py"
    files = {**{name: path for name, path in MODULES.items() if not _is_door(name)}, "tests.engine.helpers": helpers}
    for module, path in files.items():
        everywhere = {imp for imp in _imports(path) if _is_door(imp)}
        assert not everywhere, f"{module} imports the door: {sorted(everywhere)}"
        assert not {imp for imp in _top_level_imports(path) if _is_door(imp)}, module
    assert f'DOOR = "{DOOR}"' in MODULES[DOOR_GATE].read_text(encoding="utf-8")  # opened by name, in `_choose`


def test_torchs_private_names_appear_in_the_door_alone() -> None:
    """`grep -rn "torch\\._" batching/` finds the door's files and nothing else (code, docstrings and comments)."""
    outside = []
    for path in sorted((ROOT / "batching").rglob("*.py")):
        if _is_door(_module_name(path)):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "torch._" in line:
                outside.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not outside, "torch's private names outside the door:\n" + "\n".join(outside)
    assert any(
        "torch._" in path.read_text(encoding="utf-8")
        for path in (ROOT / "batching" / "engine" / "torch_door").glob("*.py")
    )
