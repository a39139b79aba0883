"""finetune's checkpoints: `--resume` checks everything it reads from one against the run before anything is
restored (a mismatch is one line naming the file, exit 1), and a full disk while saving one is one line."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

from eaglekit.errors import CheckpointError  # noqa: E402
from eaglekit.finetune.checkpoints import Checkpoints, load_checkpoint, save_checkpoint  # noqa: E402
from eaglekit.finetune.train import TrainOptions  # noqa: E402

pytestmark = pytest.mark.model

OPTS = TrainOptions(steps=10, depth=2)


def run_state():
    """Two trained parameters and an AdamW that has stepped both once."""
    torch.manual_seed(0)
    params = {"fc.weight": torch.nn.Parameter(torch.randn(4, 6)), "norm.weight": torch.nn.Parameter(torch.ones(4))}
    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-3)
    (params["fc.weight"].sum() + params["norm.weight"].pow(2).sum()).backward()
    optimizer.step()
    return params, optimizer


@pytest.fixture
def checkpoint(tmp_path):
    params, optimizer = run_state()
    ck = Checkpoints(str(tmp_path / "ckpt"), 1, "run")
    history = [{"step": 2, "loss": 3.5, "accuracy": [0.5, 0.25], "lr": 1e-3, "tokens_per_s": 10.0, "seconds": 1.0}]
    from eaglekit.finetune.checkpoints import HeldOut, StepRecord, Validation

    held_out = HeldOut([Validation.of(0, 4.0, [0.25, 0.125]), Validation(2, 3.5, [0.5, 0.25], 1.625, 1.5, 4)],
                       {n: p.detach().clone() + 1 for n, p in params.items()})
    path = save_checkpoint(ck, 3, params, optimizer, [StepRecord(**r) for r in history], held_out)
    return ck, path


def resume(ck):
    params, optimizer = run_state()
    before = {n: p.detach().clone() for n, p in params.items()}
    try:
        return load_checkpoint(ck, params, optimizer, steps=OPTS.steps, depth=OPTS.depth)
    finally:  # a refused checkpoint restores nothing
        if not all(torch.equal(before[n], p) for n, p in params.items()):
            pytest.fail("a refused checkpoint changed the weights")


def test_an_untouched_checkpoint_resumes(checkpoint):
    ck, path = checkpoint
    params, optimizer = run_state()
    step, history, held_out = load_checkpoint(ck, params, optimizer, steps=OPTS.steps, depth=OPTS.depth)
    assert step == 3 and [r.step for r in history] == [2]
    saved = load_file(os.path.join(path, "weights.safetensors"))
    assert all(torch.equal(saved[n], p) for n, p in params.items())
    assert held_out is not None and [(v.step, v.decode_tau, v.decode_rounds) for v in held_out.scores] == \
        [(0, None, 0), (2, 1.5, 4)] and held_out.scores[0].score == 1.28125
    assert all(torch.equal(held_out.best[n], saved[n] + 1) for n in saved)


def test_a_checkpoint_without_held_out_state_resumes_with_none(tmp_path):
    """A run without held-out data (and a checkpoint written before the selection was kept) has none to restore."""
    params, optimizer = run_state()
    ck = Checkpoints(str(tmp_path / "ckpt"), 1, "run")
    path = save_checkpoint(ck, 3, params, optimizer, [])
    assert sorted(os.listdir(path)) == ["optimizer.safetensors", "state.json", "weights.safetensors"]
    assert load_checkpoint(ck, *run_state(), steps=OPTS.steps, depth=OPTS.depth).held_out is None


def edit_tensors(path: str, name: str, edit) -> None:
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def edit_state(path: str, edit) -> None:
    file = os.path.join(path, "state.json")
    state = json.load(open(file))
    edit(state)
    json.dump(state, open(file, "w"))


@pytest.mark.parametrize("file, edit, message", [
    # a one-element tensor would broadcast over the matrix and training would go on
    ("weights.safetensors", lambda t: t.update({"fc.weight": torch.zeros(1)}), "fc.weight is F32[1], this run trains "
                                                                              "it as F32[4, 6]"),
    ("weights.safetensors", lambda t: t.update({"fc.weight": t["fc.weight"].half()}), "is F16[4, 6]"),
    ("weights.safetensors", lambda t: t.update({"extra": torch.zeros(2)}), "holds 'extra', which this run does not"),
    ("weights.safetensors", lambda t: t.pop("norm.weight"), "lacks 'norm.weight'"),
    ("weights.safetensors", lambda t: t["fc.weight"].__setitem__((0, 0), float("nan")), "not finite"),
    ("optimizer.safetensors", lambda t: t.update({"fc.weight::exp_avg": torch.zeros(6, 4)}),
     "fc.weight::exp_avg is F32[6, 4]"),
    ("optimizer.safetensors", lambda t: t.pop("norm.weight::exp_avg_sq"), "lacks 'norm.weight::exp_avg_sq'"),
    ("optimizer.safetensors", lambda t: t.update({"fc.weight::exp_avg_sq": -torch.ones(4, 6)}), "negative"),
    ("optimizer.safetensors", lambda t: t.update({"fc.weight::step": torch.tensor(1e9)}), "not a step count"),
    ("state.json", lambda s: s.update(step="3"), "step '3' is not a step of this run (0 to --steps 10)"),
    ("state.json", lambda s: s.update(step=-4), "step -4 is not a step of this run"),
    ("state.json", lambda s: s.update(step=10**18), "is not a step of this run"),
    ("state.json", lambda s: s["history"][0].update(wings=1), "history record 0 has other fields"),
    ("state.json", lambda s: s["history"][0].update(accuracy=[0.5]), "accuracy must list 2 rates"),
    ("state.json", lambda s: s["history"][0].update(step=7), "step 7 does not follow 0 up to 3"),
    ("state.json", lambda s: s.update(history={"a": 1}), "history must be a list"),
    ("state.json", lambda s: s.update(held_out=[]), "held_out must list 1 to 4 scores"),
    ("state.json", lambda s: s["held_out"][1].update(step=0), "held-out score 1 step 0 does not follow 0 up to 3"),
    ("state.json", lambda s: s["held_out"][0].update(accuracy=[0.5, 2.0]), "accuracy must list 2 rates in [0, 1]"),
    ("state.json", lambda s: s["held_out"][1].update(decode_tau=0.5), "decode_tau must be a number of at least 1"),
    ("state.json", lambda s: s["held_out"][1].update(decode_rounds=1.5), "decode_rounds must be a whole number"),
    ("state.json", lambda s: s["held_out"][0].pop("score"), "held-out score 0 has other fields"),
    ("state.json", lambda s: s["held_out"][0].update(score="2"), "held-out score 0 loss and score must be finite"),
    ("state.json", lambda s: s["history"][0].update(lr=None), "loss, lr, tokens_per_s and seconds must be finite"),
    ("best.safetensors", lambda t: t.update({"fc.weight": torch.zeros(1)}), "fc.weight is F32[1], this run trains"),
    ("best.safetensors", lambda t: t.pop("norm.weight"), "lacks 'norm.weight'"),
    ("best.safetensors", lambda t: t["norm.weight"].__setitem__(0, float("inf")), "not finite"),
])
def test_a_tampered_checkpoint_is_one_line_naming_the_file(checkpoint, file, edit, message):
    ck, path = checkpoint
    full = os.path.join(path, file)
    if file == "state.json":
        edit_state(path, edit)
    else:
        edit_tensors(full, file, edit)
    with pytest.raises(CheckpointError) as refusal:
        resume(ck)
    assert str(refusal.value).startswith(f"{full}: ") and message in str(refusal.value), str(refusal.value)
    assert "\n" not in str(refusal.value)


def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    import errno

    import safetensors.torch

    from eaglekit.errors import OutputError

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    params, optimizer = run_state()
    folder = tmp_path / "new" / "ckpt"  # created by the save, with its parent
    with pytest.raises(OutputError, match=r"step-0000003: cannot write the checkpoint \(No space left on device\); "
                                          "nothing was written"):
        save_checkpoint(Checkpoints(str(folder), 1, "run"), 3, params, optimizer, [])
    assert os.listdir(tmp_path) == []
