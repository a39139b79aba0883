"""The package's public names resolve lazily, and importing eaglekit never imports torch."""

import importlib
import json
import subprocess
import sys

import pytest

import eaglekit
from tests.support import REPO
from tests.support.cli import run_cli


def test_public_names_resolve_to_the_library():
    from eaglekit.families import load_draft
    from eaglekit.upgrade.run import upgrade

    assert eaglekit.load_draft is load_draft
    assert eaglekit.upgrade_draft is upgrade
    importlib.import_module("eaglekit.upgrade")  # the subpackage owns the short name; the alias stays stable

    assert eaglekit.upgrade_draft is upgrade
    for name in eaglekit.__all__:
        assert getattr(eaglekit, name) is not None


def test_import_is_light():
    code = "import sys, eaglekit; eaglekit.load_draft; eaglekit.run_rules; eaglekit.push; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("blocked, extra", [("torch", "torch"), ("transformers", "torch")])
def test_a_missing_optional_dependency_is_one_line_naming_the_extra(tmp_path, blocked, extra):
    from tests.support.factory import make_draft, make_target_config

    draft = make_draft(str(tmp_path / "d"), "vllm")
    target = make_target_config(str(tmp_path / "t"))
    code = (f"import sys; sys.modules[{blocked!r}] = None\n"
            "from eaglekit.cli.main import main\n"
            f"main(['verify', {draft!r}, '--target', {target!r}, '--no-progress'])")  # a slow machine's stage lines
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: this command needs {blocked}, which is not installed: pip install 'eaglekit[{extra}]'"]


def test_a_parquet_prompt_file_without_pyarrow_names_the_speedbench_extra(tmp_path):
    from tests.support.factory import make_draft, make_target_config

    draft = make_draft(str(tmp_path / "d"), "vllm")
    target = make_target_config(str(tmp_path / "t"))
    prompts = tmp_path / "speed.parquet"
    prompts.write_bytes(b"PAR1")  # never opened: the reader's import fails first
    code = ("import sys; sys.modules['pyarrow'] = None\n"
            "from eaglekit.cli.main import main\n"
            f"main(['verify', {draft!r}, '--target', {target!r}, '--prompts', {str(prompts)!r}])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: this command needs pyarrow, which is not installed: pip install 'eaglekit[speedbench]'"]


def _module_imports() -> dict[str, set[str]]:
    """eaglekit module -> the eaglekit modules it imports (module level or inside functions)."""
    import ast
    import pathlib

    root = pathlib.Path(eaglekit.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                found |= {base} | {f"{base}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def test_no_import_cycles():
    """Layering: no eaglekit module reaches itself through its imports, lazy ones included."""
    graph = _module_imports()
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*trail[trail.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])


SHARED_FACTS = ("DTYPE_SIZES", "FLOAT_DTYPES", "NUMPY_DTYPES", "REPO_ID", "LEGACY_NAMES", "tensor_nbytes",
                "element_count", "eagle_version", "as_ids", "int_at", "aux_ids", "int_list", "RECORDS", "Engine")


def test_each_shared_fact_is_defined_in_one_module():
    """One home per fact: a table, pattern or reader used across modules is defined once, at module level."""
    import ast
    import pathlib

    homes: dict[str, list[str]] = {name: [] for name in SHARED_FACTS}
    for path in pathlib.Path(eaglekit.__file__).parent.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
                t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
            for name in names:
                if name in homes:
                    homes[name].append(str(path))
    assert {name: len(paths) for name, paths in homes.items()} == dict.fromkeys(SHARED_FACTS, 1), homes


def test_the_json_schemas_ship_with_the_package():
    """--format json names its schema; it must be there for an installed wheel, not only in a checkout."""
    import json
    tomllib = pytest.importorskip("tomllib")
    from importlib import resources
    from pathlib import Path

    folder = resources.files("eaglekit").joinpath("schemas")
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".schema.json"))
    assert {"inspect-report.schema.json", "validate-report.schema.json", "verify-report.schema.json",
            "upgrade-report.schema.json", "finetune-report.schema.json", "push-result.schema.json"} <= set(names)
    for name in names:
        json.loads(folder.joinpath(name).read_text(encoding="utf-8"))
    pyproject = tomllib.loads((Path(eaglekit.__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert "schemas/*.json" in pyproject["tool"]["setuptools"]["package-data"]["eaglekit"]


def test_a_mistyped_command_names_the_closest_one():
    result = run_cli(["inspec", "x"])
    assert result.exit_code == 2 and "Did you mean 'inspect'?" in result.stderr
    assert "Commands: inspect" in run_cli(["zzz"]).stderr


def test_a_failure_under_format_json_is_also_a_json_document(tmp_path):
    from importlib import resources

    import jsonschema

    schema = json.loads(resources.files("eaglekit").joinpath("schemas", "error.schema.json").read_text())
    cases = [(["inspect", str(tmp_path / "missing"), "--format", "json"], 1, "CheckpointError"),
             (["verify", "draft", "--format=json"], 2, "UsageError")]
    for args, code, kind in cases:
        result = run_cli(args)
        assert result.exit_code == code
        doc = json.loads(result.stdout)
        jsonschema.validate(doc, schema)
        assert doc["error"]["type"] == kind and doc["error"]["exit_code"] == code
        assert result.stderr.strip().splitlines()[-1] == "Error: " + doc["error"]["message"]
    plain = run_cli(["inspect", str(tmp_path / "missing")])
    assert plain.stdout == "" and plain.exit_code == 1


def test_type_checkers_see_every_public_name():
    import ast

    import eaglekit

    tree = ast.parse(open(eaglekit.__file__, encoding="utf-8").read())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {(node.module, alias.name, alias.asname or alias.name) for node in guarded.body for alias in node.names}
    assert seen == {(module, attribute, name) for name, (module, attribute) in eaglekit._EXPORTS.items()}


ENGINE_AND_DIALECT_NAMES = {"vllm", "sglang", "trtllm", "llamacpp", "tokenspeed", "gguf"}


def _engine_name_comparisons(source: str) -> list[int]:
    """Lines that compare against an engine or output-dialect name (a literal or one of the name constants)."""
    import ast

    constants = {n.upper() for n in ENGINE_AND_DIALECT_NAMES}
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in [node.left, *node.comparators]:
            values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            if any((isinstance(v, ast.Constant) and v.value in ENGINE_AND_DIALECT_NAMES)
                   or (isinstance(v, ast.Name) and v.id in constants) for v in values):
                lines.append(node.lineno)
    return sorted(set(lines))


def test_engines_are_data_outside_eaglekit_engines():
    """Code outside eaglekit/engines/ asks an engine's record (or a dialect's module) and never compares names,
    so adding an engine touches its own modules only."""
    import pathlib

    root = pathlib.Path(eaglekit.__file__).parent
    assert _engine_name_comparisons("if engine == VLLM or to in ('gguf', 'sglang'):\n    pass\n") == [1]
    found = {}
    for path in root.rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(("engines/", "upgrade/dialects/")):
            continue
        lines = _engine_name_comparisons(path.read_text(encoding="utf-8"))
        if lines:
            found[relative] = lines
    assert found == {}


def test_the_schemas_name_every_engine():
    """The JSON schemas enumerate the engines a report can name: exactly the records eaglekit models."""
    import pathlib

    from eaglekit.engines import RECORDS

    root = pathlib.Path(eaglekit.__file__).parent / "schemas"
    enums = []

    def collect(node):
        if isinstance(node, dict):
            if "enum" in node and "llamacpp" in node["enum"]:
                enums.append([e for e in node["enum"] if e is not None])
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for path in sorted(root.glob("*.json")):
        collect(json.loads(path.read_text(encoding="utf-8")))
    assert enums and all(enum == list(RECORDS) for enum in enums), enums


def test_helpers_live_in_tests_support_and_no_module_imports_a_test_module():
    """A test module imported by another runs its module-level set-up twice and ties the two together: what tests and
    benches share lives in tests/support/."""
    import ast

    root = REPO
    found = []
    for path in [*root.joinpath("tests").rglob("*.py"), *root.joinpath("bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.relative_to(root)}: {n}" for n in names
                      if n.startswith("tests.") and not n.startswith("tests.support")]
    assert found == []


PROJECT_TESTS = "project"
"""The folder of the tests that hold the repository together (docs, CI, the package's shape) rather than one room."""


def test_the_tests_mirror_the_package():
    """Each test module sits in the folder of the room it tests: a subpackage of eaglekit (tests/capture/ for
    eaglekit/capture/), a top-level module (tests/target/ for eaglekit/target.py) or tests/project/; none at the top."""
    rooms = {p.name for p in (REPO / "eaglekit").iterdir() if (p / "__init__.py").exists()}
    rooms |= {p.stem for p in (REPO / "eaglekit").glob("*.py")} | {PROJECT_TESTS}
    modules = sorted((REPO / "tests").rglob("test_*.py"))
    assert modules and not [p.name for p in modules if p.parent == REPO / "tests"]
    strays = sorted({p.parent.name for p in modules if p.parent.parent == REPO / "tests"} - rooms)
    assert strays == [], f"tests/ folders that name no room of eaglekit: {strays}"
    assert not [str(p.relative_to(REPO)) for p in modules if p.parent.parent != REPO / "tests"]


def test_capture_depends_on_neither_finetune_nor_upgrade():
    """capture/ is the one producer of the target's states; finetune and upgrade read them through it, never the
    reverse: no module of eaglekit.capture imports eaglekit.finetune or eaglekit.upgrade (lazy imports included)."""
    graph = _module_imports()
    reverse = {name: sorted(m for m in imports if m.split(".")[:2] in (["eaglekit", "finetune"],
                                                                        ["eaglekit", "upgrade"]))
               for name, imports in graph.items() if name.startswith("eaglekit.capture")}
    assert {name: found for name, found in reverse.items() if found} == {}


CAPTURE_PRIMITIVES = {"capture_with_reference", "capture_with_vllm", "imported_records", "generate_answers"}
"""The functions that run the target (or read an engine's files) to produce its states or answers: capture/'s own."""
HOOKS = {"output_hidden_states", "register_forward_hook"}
"""What reads a model's hidden states in process: the target adapter's (eaglekit.target_model) and capture/'s (a
forward pre-hook also changes inputs: eaglekit.quantization's emulate served numerics with them)."""
TARGET_RUNNERS = ("eaglekit/capture/", "eaglekit/decode/", "eaglekit/target_model.py")
"""Where the target may be run for its states: capture/, and the decode loops, which draft from them as served."""


def _captures_states(path: str, source: str) -> list[str]:
    """What in one module runs the target to capture its hidden states: a capture primitive named, a hidden-state
    hook, or a target's forward asked for layer ids (`target.forward(tokens, ids, ...)`)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute)
                 else [a.name for a in node.names] if isinstance(node, ast.ImportFrom)
                 else [k.arg for k in node.keywords if k.arg] if isinstance(node, ast.Call) else [])
        if not path.startswith("eaglekit/capture/"):
            found += [f"{name} (line {node.lineno})" for name in names if name in CAPTURE_PRIMITIVES]
        if not path.startswith(TARGET_RUNNERS):
            found += [f"{name} (line {node.lineno})" for name in names if name in HOOKS]
            func = node.func if isinstance(node, ast.Call) else None
            if (isinstance(func, ast.Attribute) and func.attr == "forward" and len(node.args) >= 2
                    and "target" in ast.unparse(func.value).lower()):
                found.append(f"{ast.unparse(func)}(…, layer ids) (line {node.lineno})")
    return found


def test_only_capture_runs_the_target_to_capture_its_hidden_states():
    """finetune, upgrade and every other module get the target's states from capture/ (a store, or the in-process
    capture into one), so there is one record type, one format and one identity for them."""
    import pathlib

    root = pathlib.Path(eaglekit.__file__).parent.parent
    found = {}
    for path in sorted((root / "eaglekit").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if hits := _captures_states(rel, path.read_text(encoding="utf-8")):
            found[rel] = hits
    assert found == {}


@pytest.mark.parametrize("path, source", [
    ("eaglekit/finetune/data.py", "def capture(target, seq, ids):\n    return target.forward(seq, ids).aux\n"),
    ("eaglekit/upgrade/run.py", "from eaglekit.capture.reference import capture_with_reference\n"),
    ("eaglekit/verify/run.py", "def states(model, ids):\n    return model(ids, output_hidden_states=True)\n"),
])
def test_the_capture_scan_sees_a_capture_outside_capture(path, source):
    assert _captures_states(path, source)
    assert not _captures_states("eaglekit/capture/reference.py", source)
