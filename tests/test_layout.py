"""The layout's rules, checked on the sources (no import runs): bookkeeping never imports a feature (checkpoints,
metrics, memory, evaluation and resume handle whatever state they are given); no two modules import each other;
every feature answers the protocol of speedgpt/features/__init__.py; train.py names each feature in one place."""
import ast
import os

from conftest import ROOT

BOOKKEEPING = ("checkpoint", "measure", "memory", "evaluation", "resume", "distributed", "budget", "hellaswag")
KERNELS = ("softmax_pass", "cast_kernel")    # a feature's kernels: its check checks their flag (fused_ce's, fp8's)
FEATURES = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "speedgpt", "features"))
                  if f.endswith(".py") and f != "__init__.py")


def imports(path):
    """The modules `path` imports (dotted names, `from a import b` as a.b and a), at any depth of the file."""
    tree, found = ast.parse(open(path).read()), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def project_modules():
    """{dotted name: path} of the project's Python modules (the front door, speedgpt/ and its features/)."""
    out = {m[:-3]: os.path.join(ROOT, m) for m in os.listdir(ROOT) if m.endswith(".py")}
    for sub, package in (("speedgpt", "speedgpt"), (os.path.join("speedgpt", "features"), "speedgpt.features")):
        for f in os.listdir(os.path.join(ROOT, sub)):
            if f.endswith(".py") and f != "__init__.py":
                out[f"{package}.{f[:-3]}"] = os.path.join(ROOT, sub, f)
    return out


def test_bookkeeping_imports_no_feature():
    for name in BOOKKEEPING:
        bad = sorted(m for m in imports(os.path.join(ROOT, "speedgpt", f"{name}.py"))
                     if m.startswith("speedgpt.features"))
        assert not bad, f"speedgpt/{name}.py imports {bad}: bookkeeping must handle the state it is given"


def test_no_two_modules_import_each_other():
    modules = project_modules()
    graph = {m: {n for n in imports(p) if n in modules and n != m} for m, p in modules.items()}
    loops = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    assert not loops, f"modules that import each other: {loops}"


def test_every_feature_answers_the_protocol_and_train_lists_it_once():
    train = open(os.path.join(ROOT, "train.py")).read()
    for name in FEATURES:
        tree = ast.parse(open(os.path.join(ROOT, "speedgpt", "features", f"{name}.py")).read())
        defined = {n.name: [a.arg for a in n.args.args] for n in tree.body if isinstance(n, ast.FunctionDef)}
        if name in KERNELS:
            continue
        assert defined.get("check", [])[:2] == ["cfg", "proc"], f"features/{name}.py: check(cfg, proc)"
        transform = "wrap" if name == "parallel" else "apply"
        assert defined.get(transform, [])[:3] == ["model", "cfg", "proc"], f"features/{name}.py: {transform}"
        assert defined.get("memory", ["model", "cfg", "parts"]) == ["model", "cfg", "parts"], \
            f"features/{name}.py: memory(model, cfg, parts), as memory.estimate calls it"
        assert train.count(f" {name}.") == 0 or name == "parallel", f"train.py calls {name} outside its lists"


SCRIPTS = sorted([f for f in os.listdir(ROOT) if f.endswith(".py")] +
                 [os.path.join("benchmarks", f) for f in os.listdir(os.path.join(ROOT, "benchmarks")) if f.endswith(".py")])


def test_every_script_answers_help_with_its_usage_and_exit_0():
    """`--help` is how a user finds a script's flags: it prints them and succeeds, never an error exit that a shell
    loop or a Makefile would read as a failure (kernel_diff.py and profile_summary.py exited 1)."""
    import subprocess
    import sys
    bad = []
    for script in SCRIPTS:
        if script in ("configurator.py", "model.py") or not open(os.path.join(ROOT, script)).read().count("__main__"):
            continue                        # modules without a command line
        r = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        if r.returncode != 0 or len(r.stdout.strip()) < 40 or "Traceback" in r.stderr:
            bad.append(f"{script}: exit {r.returncode}, {(r.stdout + r.stderr).strip()[:80]!r}")
    assert not bad, "\n".join(bad)
