"""Nothing a command writes may clobber a source, a target or a finished output.

Every path a command writes (outputs, --plot, --save-report, --profile-out, checkpoint folders, caches) is
generated here to be, lie inside, contain, or reach through a symbolic link something the same command reads; the
command must refuse in one line before any work and leave every byte as it was, --force included. The cleanup of
checkpoints, a full disk under a GGUF output and SIGINT / SIGTERM mid-run are driven the same way: real commands,
real bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from eaglekit.errors import CheckpointError, UsageError  # noqa: E402
from eaglekit.finetune.checkpoints import Checkpoints, load_checkpoint, save_checkpoint  # noqa: E402
from eaglekit.finetune.train import TrainOptions  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.cli import ctrl_c_reaches_it  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.hostile import clean, refused  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402
from tests.support.targets import make_tiny_target, tiny_target_gguf  # noqa: E402

pytestmark = pytest.mark.model

LOADS = 120  # a command that loads a target or decodes (the first one in a process also imports torch)
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
VOCAB = 49152  # SmolLM2's tokenizer


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Each input in a folder of its own (so a path 'around' it holds nothing else), a scratch area for writes."""
    base = str(tmp_path_factory.mktemp("hostile-writes"))

    def home(name: str) -> str:
        os.makedirs(os.path.join(base, "inputs", name))
        return os.path.join(base, "inputs", name)

    draft = make_draft(os.path.join(home("draft"), "a"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=512,
                       aux_ids=(1, 2, 3), target_layers=4)
    draft_b = make_draft(os.path.join(home("draft-b"), "b"), "vllm", hidden=64, vocab=VOCAB, draft_vocab=512,
                         aux_ids=(1, 2, 3), target_layers=4, seed=7)
    target = make_tiny_target(os.path.join(home("target"), "t"), vocab=VOCAB, tokenizer_from=smollm2_path())
    gguf_target = tiny_target_gguf(os.path.join(home("gguf"), "target.gguf"), layers=4, vocab=VOCAB)
    prompts = os.path.join(home("prompts"), "prompts.jsonl")
    with open(prompts, "w") as fh:
        fh.write("\n".join(json.dumps({"prompt": f"Count to {i}."}) for i in range(4)) + "\n")
    data = os.path.join(home("data"), "data.jsonl")
    with open(data, "w") as fh:
        fh.write("\n".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i} + {i * i}\n" * (1 + i % 3)})
                           for i in range(16)) + "\n")
    output = os.path.join(home("output"), "published")
    shutil.copytree(draft, output)  # a finished output that a later run's side files must not touch
    os.makedirs(os.path.join(base, "scratch"))
    return {"base": base, "draft": draft, "draft B": draft_b, "target": target, "target.gguf": gguf_target,
            "prompts": prompts, "data": data, "output": output, "cache": os.path.join(base, "cache"),
            "scratch": os.path.join(base, "scratch")}


def snapshot(root: str) -> dict[str, str]:
    """Every entry under `root`: file digests, link targets, folders."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                seen[rel] = "-> " + os.readlink(path)
            elif os.path.isdir(path):
                seen[rel] = "dir"
            else:
                with open(path, "rb") as fh:
                    seen[rel] = hashlib.sha256(fh.read()).hexdigest()
    return seen


# ---------------------------------------------------------------- paths that reach into what a command reads

FILE, FOLDER = "file", "folder"  # what a write option creates
SHAPES = {  # how a written path reaches a protected one, by (what is written, what is protected)
    (FILE, FOLDER): ("inside", "dotted", "link-inside"),
    (FILE, FILE): ("itself", "link"),
    (FOLDER, FOLDER): ("itself", "inside", "dotted", "around", "link", "link-inside"),
    (FOLDER, FILE): ("itself", "around", "link"),
}
NAMES = {FILE: ("config.json", "model.safetensors", "tokenizer.json", "new.png", "report.json"),
         FOLDER: ("sub", "new-output")}


def reaching(protected: str, shape: str, name: str, scratch: str) -> str:
    """A path that is, lies inside, holds, or reaches through a symbolic link the protected path."""
    if shape == "itself":
        return protected
    if shape == "inside":
        return os.path.join(protected, name)
    if shape == "dotted":
        return os.path.join(protected, "..", os.path.basename(protected), ".", name)
    if shape == "around":
        return os.path.dirname(protected)
    link = os.path.join(scratch, "link" + os.path.splitext(protected)[1])
    os.symlink(protected, link)
    return link if shape == "link" else os.path.join(link, name)


def command(world, cmd: str, option: str, path: str, scratch: str) -> list[str]:
    """The command line with `path` given to `option` ("OUT": the output argument)."""
    out = path if option == "OUT" else os.path.join(scratch, "out")
    side = [] if option == "OUT" else [option, path]
    if cmd == "verify":
        return ["verify", world["draft"], "--target", world["target"], "--prompts", world["prompts"], "--limit", "1",
                "--max-new-tokens", "4", "--no-progress", *side]
    if cmd == "compare":
        return ["compare", world["draft"], world["draft B"], "--target", world["target"], "--prompts",
                world["prompts"], "--limit", "1", "--max-new-tokens", "4", "--no-progress", *side]
    if cmd == "finetune":
        if option == "--plot" and world.get("plot into output"):
            out = world["output"]
        cache = [] if option == "--cache-dir" else ["--cache-dir", world["cache"]]
        return ["finetune", world["draft"], out, "--target", world["target"], "--data", world["data"], *cache,
                "--steps", "1", "--no-eval", "--force", "--no-progress", *side]
    if cmd == "upgrade-gguf":
        return ["upgrade", world["draft"], out, "--to", "gguf", "--target", world["target.gguf"], "--force"]
    return ["upgrade", world["draft"], out, "--target", world["target"], "--no-fc-norm", "--no-norm-output", "--force"]


def protected_kind(world, key: str) -> str:
    return FOLDER if os.path.isdir(world[key]) else FILE


def check_refused(world, data, cases) -> None:
    cmd, option, written, key = data.draw(st.sampled_from(cases), label="case")
    shapes = SHAPES[written, protected_kind(world, key)]
    if written == FOLDER and option != "OUT" and protected_kind(world, key) == FILE:
        shapes = ("around",)  # --checkpoint-dir / --cache-dir naming a file are Click's to refuse
    shape = data.draw(st.sampled_from(shapes), label="shape")
    name = data.draw(st.sampled_from(NAMES[written] if cmd != "upgrade-gguf" else ("new.gguf",)), label="name")
    scratch = tempfile.mkdtemp(dir=world["scratch"])
    path = reaching(world[key], shape, name, scratch)
    before, links = snapshot(os.path.join(world["base"], "inputs")), os.listdir(scratch)
    result = refused(*command({**world, "plot into output": key == "output"}, cmd, option, path, scratch),
                     code=2, contains="overlaps")
    assert "eaglekit never writes into what it reads" in result.stderr or "needs its own path" in result.stderr
    assert snapshot(os.path.join(world["base"], "inputs")) == before
    assert os.listdir(scratch) == links  # nothing was written anywhere


SIDE_OUTPUTS = [
    *[("verify", option, FILE, key) for option in ("--save-report", "--profile-out", "--plot")
      for key in ("draft", "target", "prompts")],
    *[("compare", option, FILE, key) for option in ("--save-report", "--plot")
      for key in ("draft", "draft B", "target", "prompts")],
    *[("finetune", "--plot", FILE, key) for key in ("draft", "target", "data", "output")],
]


@FUZZ
@given(data=st.data())
def test_side_outputs_never_land_in_what_a_command_reads_or_has_published(world, data):
    """verify/compare --save-report, --profile-out and --plot, finetune --plot: into a draft, the target, the
    prompts or data file, or the output finetune publishes (--force given), by any spelling or link."""
    check_refused(world, data, SIDE_OUTPUTS)


FINETUNE_FOLDERS = [("finetune", option, FOLDER, key) for option in ("OUT", "--checkpoint-dir", "--cache-dir")
                    for key in ("draft", "target", "data")]


@FUZZ
@given(data=st.data())
def test_finetune_writes_no_output_checkpoint_or_cache_into_its_inputs(world, data):
    check_refused(world, data, FINETUNE_FOLDERS)


def test_the_default_checkpoint_folder_of_an_output_is_never_its_source(world, tmp_path):
    """`finetune X.checkpoint X`: the default checkpoint folder (OUT.checkpoint) is the source; refused, kept."""
    source = str(tmp_path / "m.checkpoint")
    shutil.copytree(world["draft"], source)
    before = snapshot(str(tmp_path))
    result = refused("finetune", source, str(tmp_path / "m"), "--target", world["target"], "--data", world["data"],
                     "--cache-dir", world["cache"], "--no-eval", "--no-progress", code=2,
                     contains="overlaps the source")
    assert "--checkpoint-dir (default OUT.checkpoint)" in result.stderr
    assert snapshot(str(tmp_path)) == before


UPGRADES = [("upgrade", "OUT", FOLDER, key) for key in ("draft", "target")] + \
           [("upgrade-gguf", "OUT", FILE, key) for key in ("draft", "target.gguf")]


@FUZZ
@given(data=st.data())
def test_upgrade_never_replaces_or_deletes_its_source_or_target(world, data):
    """The output (a folder, or --to gguf's file) is, holds, or lies in the source or the target: --force given,
    nothing is replaced; an output anywhere else is written."""
    if data.draw(st.booleans(), label="elsewhere"):
        cmd = data.draw(st.sampled_from(["upgrade", "upgrade-gguf"]), label="command")
        scratch = tempfile.mkdtemp(dir=world["scratch"])
        out = os.path.join(scratch, "out.gguf" if cmd == "upgrade-gguf" else "out")
        clean(*command(world, cmd, "OUT", out, scratch), codes=(0,), seconds=LOADS)
        assert os.path.exists(out)
        return
    check_refused(world, data, UPGRADES)


# ---------------------------------------------------------------- side outputs over checkpoints a command does not read

FOREIGN_SIDE_OUTPUTS = [("verify", option) for option in ("--save-report", "--profile-out", "--plot")] + \
                       [("compare", option) for option in ("--save-report", "--plot")] + [("push", "--card-out")]
FOREIGN_SHAPES = {FOLDER: ("inside", "dotted", "link-inside", "nested"), FILE: ("itself", "link")}


def side_command(world, cmd: str, option: str, path: str, scratch: str) -> list[str]:
    if cmd == "push":
        return ["push", world["draft"], "--repo-id", "eagle-org/draft", "--license", "apache-2.0", "--target",
                "meta-llama/Llama-3.1-8B-Instruct", "--dry-run", "--offline", option, path]
    return command(world, cmd, option, path, scratch)


@FUZZ
@given(data=st.data())
def test_side_outputs_never_land_in_or_replace_a_checkpoint_the_command_does_not_read(world, data):
    """A finished draft folder and a GGUF file that verify, compare and push do not read: a report, profile,
    plot or card inside the folder (a new name or one of its files, by any spelling or link) or over the file is
    refused in one line before any work, --force or not; the same option beside them is written."""
    cmd, option = data.draw(st.sampled_from(FOREIGN_SIDE_OUTPUTS), label="case")
    scratch = tempfile.mkdtemp(dir=world["scratch"])
    if data.draw(st.booleans(), label="beside") and cmd == "push":
        path = os.path.join(os.path.dirname(world["output"]), "card.md")
        clean(*side_command(world, cmd, option, path, scratch), codes=(0,), seconds=LOADS)
        assert os.path.getsize(path) > 0
        os.remove(path)
        return
    key = data.draw(st.sampled_from(["output", "target.gguf"]), label="checkpoint")
    shape = data.draw(st.sampled_from(FOREIGN_SHAPES[protected_kind(world, key)]), label="shape")
    name = data.draw(st.sampled_from(NAMES[FILE]), label="name")
    if shape == "nested":
        path = os.path.join(world[key], "sub", name)
    else:
        path = reaching(world[key], shape, name, scratch)
    before, links = snapshot(os.path.join(world["base"], "inputs")), os.listdir(scratch)
    result = refused(*side_command(world, cmd, option, path, scratch), code=2, contains=option)
    assert "model folder" in result.stderr or "is a model file" in result.stderr, result.stderr
    assert snapshot(os.path.join(world["base"], "inputs")) == before
    assert os.listdir(scratch) == links


# ---------------------------------------------------------------- checkpoint cleanup removes only eaglekit's own

USER_NAMES = st.one_of(st.from_regex(r"step-[0-9]{1,7}", fullmatch=True),
                       st.from_regex(r"[a-z][a-z0-9_.-]{0,10}", fullmatch=True))


def _tiny_training_state():
    param = torch.nn.Parameter(torch.randn(4, 4))
    optimizer = torch.optim.AdamW([param])
    param.grad = torch.ones_like(param)
    optimizer.step()
    return {"w": param}, optimizer


@settings(max_examples=40, deadline=None)
@given(entries=st.dictionaries(USER_NAMES, st.sampled_from(["file", "folder", "link"]), max_size=5),
       exists=st.booleans(), steps=st.lists(st.integers(1, 50), min_size=1, max_size=4, unique=True))
def test_checkpoint_cleanup_removes_only_eaglekit_checkpoints(entries, exists, steps):
    """A checkpoint folder holding a user's files, folders, links (named step-N or not): a user's step-N is
    refused before any work (it would pass for a checkpoint); otherwise saving rotates only eaglekit's
    checkpoints, the end-of-run cleanup removes them, and the folder only when eaglekit made it."""
    with tempfile.TemporaryDirectory() as root:
        outside = os.path.join(root, "outside")
        os.makedirs(outside)
        with open(os.path.join(outside, "keep.txt"), "w") as fh:
            fh.write("outside")
        folder = os.path.join(root, "ckpt")
        if exists or entries:
            os.makedirs(folder)
        for name, kind in entries.items():
            path = os.path.join(folder, name)
            if kind == "file":
                with open(path, "w") as fh:
                    fh.write(name)
            elif kind == "folder":
                os.makedirs(path)
                with open(os.path.join(path, "state.json"), "w") as fh:
                    json.dump({"format": "mine"}, fh)
            else:
                os.symlink(outside, path)
        before = snapshot(root)
        ck = Checkpoints(folder, every=1, fingerprint="run")
        if any(re.fullmatch(r"step-[0-9]+", name) for name in entries):
            with pytest.raises(UsageError, match="not an eaglekit checkpoint"):
                ck.check()
            assert snapshot(root) == before
            return
        ck.check()
        made = ck.made_by_eaglekit()
        assert made == (not exists and not entries)
        params, optimizer = _tiny_training_state()
        for step in steps:
            last = save_checkpoint(ck, step, params, optimizer, [])
        assert [os.path.basename(p) for p in ck.checkpoints()] == [os.path.basename(last)]
        ck.remove(folder=made)
        assert ck.checkpoints() == []
        assert snapshot(root) == before  # the user's entries and what their links point at, byte for byte


@settings(max_examples=30, deadline=None)
@given(saves=st.lists(st.tuples(st.sampled_from("AB"), st.integers(1, 20)), min_size=1, max_size=8))
def test_runs_sharing_a_checkpoint_folder_never_take_or_remove_each_others(saves):
    """Two runs (two fingerprints) save in one --checkpoint-dir in any order: each rotation keeps the other run's
    newest checkpoint, --resume takes the run's own newest (and says so when only the other's are there), a step
    the other run already holds is not replaced, and the cleanup removes only the run's own."""
    with tempfile.TemporaryDirectory() as folder:
        runs = {name: Checkpoints(folder, every=1, fingerprint=name) for name in "AB"}
        newest: dict[str, str] = {}
        for name, step in saves:
            params, optimizer = _tiny_training_state()
            held = os.path.join(folder, f"step-{step:07d}")
            if os.path.exists(held) and held != newest.get(name):
                before = snapshot(folder)
                with pytest.raises(CheckpointError, match="not a checkpoint of this run"):
                    save_checkpoint(runs[name], step, params, optimizer, [])
                assert snapshot(folder) == before
                continue
            newest[name] = save_checkpoint(runs[name], step, params, optimizer, [])
            assert sorted(runs[name].checkpoints()) == sorted(newest.values())
        for name, run in runs.items():
            params, optimizer = _tiny_training_state()
            if name in newest:
                assert run.own() == [newest[name]]
                step = load_checkpoint(run, params, optimizer, steps=20, depth=TrainOptions().depth).step
                assert step == int(newest[name][-7:])
            else:
                with pytest.raises(UsageError, match="every checkpoint in the folder belongs to another run"):
                    load_checkpoint(run, params, optimizer, steps=20, depth=TrainOptions().depth)
        first = saves[0][0]
        runs[first].remove(folder=True)
        assert runs[first].checkpoints() == [p for n, p in sorted(newest.items()) if n != first]


def test_a_finished_finetune_keeps_what_a_user_left_in_its_checkpoint_folder(world, tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(out + ".checkpoint")
    with open(os.path.join(out + ".checkpoint", "notes.txt"), "w") as fh:
        fh.write("mine")
    args = ["finetune", world["draft"], out, "--target", world["target"], "--data", world["data"], "--cache-dir",
            world["cache"], "--steps", "2", "--batch-tokens", "256", "--checkpoint-every", "1", "--no-eval",
            "--validation-fraction", "0", "--no-progress"]
    clean(*args, codes=(0,), seconds=LOADS)
    assert os.listdir(out + ".checkpoint") == ["notes.txt"]  # its checkpoints went, the user's file stayed
    second = str(tmp_path / "second")
    clean(*[second if a == out else a for a in args], codes=(0,), seconds=LOADS)
    assert os.path.isdir(second) and not os.path.exists(second + ".checkpoint")  # made by the run: removed


# ---------------------------------------------------------------- a full disk under a GGUF output


@contextmanager
def file_size_limit(nbytes: int):
    """Writes past `nbytes` fail with EFBIG, as on a full disk (SIGXFSZ ignored so the write call reports it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


@pytest.fixture(scope="module")
def gguf_run(world, tmp_path_factory):
    """A GGUF written once without a limit: its size, and an earlier output that --force would replace."""
    folder = str(tmp_path_factory.mktemp("gguf-out"))
    earlier = os.path.join(folder, "draft.gguf")
    clean("upgrade", world["draft"], earlier, "--to", "gguf", "--target", world["target.gguf"], codes=(0,),
          seconds=LOADS)
    return {"folder": folder, "earlier": earlier, "size": os.path.getsize(earlier)}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(0, 1.2), replace=st.booleans())
def test_a_gguf_output_on_a_full_disk_is_one_line_and_leaves_nothing_half_written(world, gguf_run, fraction,
                                                                                   replace):
    limit = int(fraction * gguf_run["size"])
    folder = gguf_run["folder"]
    out = gguf_run["earlier"] if replace else os.path.join(folder, "new.gguf")
    before = snapshot(folder)
    args = ["upgrade", world["draft"], out, "--to", "gguf", "--target", world["target.gguf"], "--force"]
    with file_size_limit(limit):
        result = clean(*args, codes=(0, 1))
    if limit >= gguf_run["size"]:
        assert result.exit_code == 0, result.stderr
        if not replace:
            os.remove(out)
        return
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {out}: cannot write the GGUF (") and "nothing was written" in result.stderr
    assert snapshot(folder) == before  # no partial file, and an earlier output is still whole


def test_a_killed_gguf_write_is_cleared_by_the_next_run_and_nothing_else_is(world, gguf_run, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    out = str(tmp_path / "d.gguf")
    leftover = tmp_path / f".d.gguf.eaglekit-partial-{dead.pid}-0badc0de.gguf"  # what a SIGKILL leaves
    leftover.write_bytes(b"GGUF half")
    live = tmp_path / f".d.gguf.eaglekit-partial-{os.getpid()}-0badc0de.gguf"  # a run still writing
    live.write_bytes(b"GGUF busy")
    mine = tmp_path / ".d.gguf.eaglekit-partial-notes"  # no process id: not eaglekit's
    mine.write_text("mine")
    clean("upgrade", world["draft"], out, "--to", "gguf", "--target", world["target.gguf"], codes=(0,), seconds=LOADS)
    assert sorted(os.listdir(tmp_path)) == sorted(["d.gguf", live.name, mine.name])
    assert live.read_bytes() == b"GGUF busy" and mine.read_text() == "mine"


# ---------------------------------------------------------------- SIGTERM and Ctrl-C mid-run


def test_finetune_under_sigterm_saves_its_checkpoint_and_exits_143(world, tmp_path):
    out = str(tmp_path / "out")
    args = [sys.executable, "-m", "eaglekit", "finetune", world["draft"], out, "--target", world["target"], "--data",
            world["data"], "--cache-dir", world["cache"], "--steps", "100000", "--batch-tokens", "256",
            "--no-eval", "--validation-fraction", "0"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
    deadline = time.monotonic() + 300
    for line in proc.stderr:
        if " step " in line or time.monotonic() > deadline:
            break
    assert " step " in line, line  # training has logged a step
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    errors = [x for x in rest.splitlines() if not x.startswith("[")]  # "[hh:mm:ss] step ..." progress lines
    assert len(errors) == 1 and errors[0].startswith("Error: ") and "checkpoint saved" in errors[0], rest
    assert "--resume" in errors[0]
    saved = [n for n in os.listdir(out + ".checkpoint")]
    assert len(saved) == 1 and saved[0].startswith("step-"), saved
    assert json.load(open(os.path.join(out + ".checkpoint", saved[0], "state.json")))["step"] >= 10
    assert not os.path.exists(out)


def test_upgrade_under_ctrl_c_exits_130_in_one_line_and_leaves_nothing(tmp_path):
    src = make_draft(str(tmp_path / "src"), "vllm", hidden=1024, heads=8, kv_heads=2, head_dim=128,
                     intermediate=4096, vocab=32768, draft_vocab=16384)
    parent = tmp_path / "work"
    parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "eaglekit", "upgrade", src, str(parent / "out"), "--dtype", "fp32",
                             "--no-fc-norm", "--no-norm-output"], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            preexec_fn=ctrl_c_reaches_it)
    end = time.monotonic() + 60
    while time.monotonic() < end and proc.poll() is None and not any(".eaglekit-partial-" in n
                                                                      for n in os.listdir(parent)):
        time.sleep(0.001)
    assert proc.poll() is None, proc.stderr.read()  # caught while it writes
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 128 + signal.SIGINT
    assert err.strip().splitlines() == ["Error: interrupted (Ctrl-C); no output was left behind"], err
    assert os.listdir(parent) == []  # no output, no staging folder
