"""The replay ledgers (bench/ledger.py, written by bench_from_scratch.py and bench_robustness.py): sittings add
drafters' counters to one file, the tables are drawn from it alone, it refuses to mix counters measured on another
target decode, other settings or other data, and a grid killed part way is continued, not redone."""

from __future__ import annotations

import json
import os
import random

import pytest

from bench.ledger import WIDE, Ledger, Replay, print_study
from eaglekit.decode import compare as compare_module
from eaglekit.decode.metrics import AcceptanceCounter
from eaglekit.decode.stats import mean_paired_difference, paired_difference

SETTINGS = {"steps": 500, "depth": 4, "lr": 0.002, "data_limit": 128, "generate": 64, "code_tokens": 24000}
COLUMNS = ["k=3 chat", "k=3 raw"]
CONVERSATIONS = [f"prompt {i}" for i in range(12)]


def _counters(k: int, seed: int) -> list[AcceptanceCounter]:
    rng = random.Random(seed)
    counters = []
    for _ in CONVERSATIONS:
        counter = AcceptanceCounter(k)
        for _ in range(20):
            counter.record(rng.randint(0, k))
        counters.append(counter)
    return counters


def _sitting(path, names: dict[str, int], source_seed: int = 0) -> Ledger:
    """One sitting's replay: the source and each named drafter (its counters drawn from its seed) in every column."""
    ledger = Ledger(str(path), SETTINGS, COLUMNS)
    ledger.check_store("a" * 64)
    for column in COLUMNS:
        ledger.add(column, _counters(3, source_seed), CONVERSATIONS,
                   {name: _counters(3, seed) for name, seed in names.items()}, {name: f"trained {seed}"
                                                                             for name, seed in names.items()})
    ledger.save()
    return ledger


def test_two_sittings_add_up_to_the_tables_of_one_and_every_cell_is_the_paired_difference(tmp_path, capsys):
    path = tmp_path / "ledger.json"
    _sitting(path, {"EAGLE-3 from scratch, seed 0": 1, "EAGLE-3.1 from scratch, seed 0": 2})
    ledger = _sitting(path, {"EAGLE-3 from scratch, seed 1": 3, "EAGLE-3.1 from scratch, seed 1": 4})
    names = [f"{f} from scratch, seed {s}" for s in (0, 1) for f in ("EAGLE-3", "EAGLE-3.1")]
    assert all(Ledger(str(path), SETTINGS, COLUMNS).has(n) for n in names)
    assert not ledger.has("EAGLE-3 from scratch, seed 2")
    ledger.print_tables(names, [0, 1])
    out = capsys.readouterr().out
    gains = [paired_difference(_counters(3, 1 + 2 * s), _counters(3, 2 + 2 * s), CONVERSATIONS) for s in (0, 1)]
    for seed, (point, interval) in enumerate(gains):
        assert f"| seed {seed} | {point:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}] |" in out
    mean, around = mean_paired_difference([(_counters(3, 1 + 2 * s), _counters(3, 2 + 2 * s)) for s in (0, 1)],
                                          CONVERSATIONS)
    assert mean == pytest.approx((gains[0][0] + gains[1][0]) / 2)
    assert around.low < mean < around.high
    assert (f"| mean over 2 seeds (min .. max) | {mean:+.3f} [{around.low:+.3f}, {around.high:+.3f}] "
            f"({min(g[0] for g in gains):+.3f} .. {max(g[0] for g in gains):+.3f}) |") in out
    assert "| EAGLE-3.1 retrain − EAGLE-3 retrain (same seed, paired), 500 steps on 128 prompts × 64 tokens + " \
           "24,000 code tokens | k=3 chat | k=3 raw |" in out
    point, interval = paired_difference(_counters(3, 0), _counters(3, 3), CONVERSATIONS)
    assert f"| EAGLE-3 from scratch, seed 1 | {point:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]" in out
    assert "EAGLE-3.1 from scratch, seed 1: trained 4" in out


def test_the_mean_over_seeds_draws_the_same_prompts_for_every_seed():
    """Two seeds with opposite gains cancel in every resample only if each resample draws one set of prompts for
    both; one seed's mean is its paired difference."""
    a, b = _counters(3, 1), _counters(3, 2)
    point, interval = mean_paired_difference([(a, b), (b, a)], CONVERSATIONS)
    assert (point, interval.low, interval.high) == (0.0, 0.0, 0.0)
    assert mean_paired_difference([(a, b)], CONVERSATIONS) == paired_difference(a, b, CONVERSATIONS)


def _study_ledger(path, data_limit: int, columns: list[str], offset: int) -> Ledger:
    """A two-seed study ledger over `columns`, its drafters' counters drawn from seeds offset by `offset` and by
    100 per column, so every column holds other counters."""
    ledger = Ledger(str(path), SETTINGS | {"data_limit": data_limit}, columns)
    for j, column in enumerate(columns):
        ledger.add(column, _counters(3, 0), CONVERSATIONS, {
            f"{f} from scratch, seed {s}": _counters(3, offset + 2 * s + i + 100 * j)
            for s in (0, 1) for i, f in enumerate(("EAGLE-3", "EAGLE-3.1"))})
    return ledger


def test_a_grid_wider_than_a_table_prints_a_row_per_column_and_a_study_sets_budgets_side_by_side(tmp_path, capsys):
    columns = [f"k=3 chat, +{1024 * i} tokens of context" for i in range(WIDE + 1)]
    small, large = _study_ledger(tmp_path / "a.json", 128, columns, 1), _study_ledger(tmp_path / "b.json", 256,
                                                                                       columns, 40)
    names = [f"{f} from scratch, seed {s}" for s in (0, 1) for f in ("EAGLE-3", "EAGLE-3.1")]
    small.print_tables(names, [0, 1])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| k=3 chat")]
    assert len(rows) == 2 * len(columns)  # the drafters' table and the seeds' table, a row per column
    last = 100 * (len(columns) - 1)  # seed 1's two retrains in the last column
    point, interval = paired_difference(_counters(3, 3 + last), _counters(3, 4 + last), CONVERSATIONS)
    assert rows[-1].split(" | ")[2] == f"{point:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]"
    assert "| k, condition: drafter − bundled EAGLE-3, 500 steps on 128 prompts × 64 tokens + 24,000 code tokens | " \
           + " | ".join(names) + " |" in out
    print_study([small, large], [0, 1])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| k=3 chat")]
    assert len(rows) == len(columns)
    for ledger, cell in zip((small, large), rows[0].split(" | ")[1:]):
        (_, _), (mean, around) = ledger.retrain_gain([0, 1], columns[0])
        assert cell.startswith(f"{mean:+.3f} [{around.low:+.3f}, {around.high:+.3f}] (")
    assert "500 steps on 128 prompts" in out and "500 steps on 256 prompts" in out
    with pytest.raises(SystemExit, match="another grid"):
        print_study([small, _study_ledger(tmp_path / "c.json", 512, columns[:2], 7)], [0, 1])


def test_a_sitting_whose_source_decoded_otherwise_is_refused_and_the_ledger_is_kept(tmp_path):
    path = tmp_path / "ledger.json"
    _sitting(path, {"EAGLE-3 from scratch, seed 0": 1})
    before = path.read_bytes()
    with pytest.raises(SystemExit, match="the bundled EAGLE-3 reference replayed to other counters under k=3 chat"):
        _sitting(path, {"EAGLE-3 from scratch, seed 1": 3}, source_seed=9)
    assert path.read_bytes() == before


@pytest.mark.parametrize("change", [{"lr": 0.001}, {"columns": ["k=3 chat"]}, {"store": "b" * 64}])
def test_a_ledger_of_other_settings_columns_or_data_is_refused(tmp_path, change):
    path = tmp_path / "ledger.json"
    _sitting(path, {"EAGLE-3 from scratch, seed 0": 1})
    if "store" in change:
        with pytest.raises(SystemExit, match="a store of other data"):
            Ledger(str(path), SETTINGS, COLUMNS).check_store(change["store"])
        return
    held = json.loads(path.read_text())
    columns = change.get("columns", COLUMNS)
    with pytest.raises(SystemExit, match="measured with other"):
        Ledger(str(path), SETTINGS | {k: v for k, v in change.items() if k != "columns"}, columns)
    assert json.loads(path.read_text()) == held


@pytest.mark.parametrize("content", ["{", "[]", '{"source": {}}'])
def test_a_file_that_is_not_a_ledger_is_one_line_and_left_as_it_is(tmp_path, content):
    path = tmp_path / "ledger.json"
    path.write_text(content)
    with pytest.raises(SystemExit, match="not a ledger this bench wrote"):
        Ledger(str(path), SETTINGS, COLUMNS)
    assert path.read_text() == content


def _fake_compare(measured: list[str], stop_at: str | None = None):
    """compare_across_k as bench/ledger.py's replay calls it, drawing each drafter's counters from its position, and
    noting each template it measures; raising KeyboardInterrupt (a kill) at `stop_at`."""
    from types import SimpleNamespace

    def compare(reference, drafts, target, options, ks, progress=None):
        template = options.template
        if template == stop_at:
            raise KeyboardInterrupt
        measured.append(template)
        def sweep(k: int, index: int) -> SimpleNamespace:
            report = SimpleNamespace(a=SimpleNamespace(counters=_counters(k, 0)), conversations=CONVERSATIONS,
                                     b=SimpleNamespace(counters=_counters(k, 1 + index)))
            return SimpleNamespace(reports=[report] * len(options.conditions))

        return {k: [sweep(k, i) for i, _ in enumerate(drafts)] for k in ks}

    return compare


def test_a_robustness_grid_killed_after_a_template_continues_with_the_rest_and_prints_from_the_ledger(
        tmp_path, monkeypatch, capsys):
    from bench import bench_robustness

    ledger = str(tmp_path / "grid.json")
    argv = ["--target", str(tmp_path), "--k", "3,6", "--contexts", "0,2048", "--templates", "chat,raw", "--limit", "12",
            "--ledger", ledger]
    measured: list[str] = []
    monkeypatch.setattr(compare_module, "compare_across_k", _fake_compare(measured, stop_at="raw"))
    with pytest.raises(KeyboardInterrupt):
        bench_robustness.main(argv)
    held = json.loads((tmp_path / "grid.json").read_text())
    assert measured == ["chat"] and [s["columns"] for s in held["sittings"]] == [
        ["k=3 chat", "k=3 chat, +2048 tokens of context", "k=6 chat", "k=6 chat, +2048 tokens of context"]]
    monkeypatch.setattr(compare_module, "compare_across_k", _fake_compare(measured))
    capsys.readouterr()
    bench_robustness.main(argv)
    assert measured == ["chat", "raw"]
    out = capsys.readouterr().out
    point, interval = paired_difference(_counters(6, 0), _counters(6, 1), CONVERSATIONS)
    rows = [line for line in out.splitlines() if line.startswith("| k=")]
    assert [row.split(" | ")[0] for row in rows] == [
        f"| k={k} {template}{context}" for k in (3, 6) for template in ("chat", "raw")
        for context in ("", ", +2048 tokens of context")]
    tau = (sum(c.accepted for c in _counters(6, 1)) / sum(c.drafts for c in _counters(6, 1))) + 1
    for row in rows[4:]:  # k=6: τ of the reference and the drafter, then their paired difference
        assert row.endswith(f" | {tau:.3f} | {point:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}] |"), row
    assert "| k, condition | τ smollm2-135m-eagle3 | τ EAGLE-3.1 | EAGLE-3.1 − smollm2-135m-eagle3 |" in out
    assert "retrain" not in out
    assert "over 2 part(s)" in out
    bench_robustness.main(argv)  # everything held: nothing measured again
    assert measured == ["chat", "raw"]


def test_a_grid_part_way_prints_what_is_measured_and_names_what_is_left(tmp_path, monkeypatch, capsys):
    from bench import bench_robustness

    argv = ["--target", str(tmp_path), "--k", "3", "--contexts", "0", "--templates", "chat,raw", "--limit", "12",
            "--ledger", str(tmp_path / "grid.json")]
    monkeypatch.setattr(compare_module, "compare_across_k", _fake_compare([], stop_at="raw"))
    with pytest.raises(KeyboardInterrupt):
        bench_robustness.main(argv)
    capsys.readouterr()
    columns = json.loads((tmp_path / "grid.json").read_text())["settings"]["columns"]
    ledger = Ledger(str(tmp_path / "grid.json"), {}, columns)  # the held settings, read back
    ledger.print_tables(["EAGLE-3.1"], [])
    out = capsys.readouterr().out
    assert [line.split(" | ")[0] for line in out.splitlines() if line.startswith("| k=")] == ["| k=3 chat"]
    assert "not measured yet: 1 of 2 columns (k=3 raw)" in out


def _drafter(folder, content: str) -> str:
    """A drafter folder as the replay digests it: a config.json of `content`."""
    folder.mkdir()
    (folder / "config.json").write_text(content)
    return str(folder)


def test_a_from_scratch_replay_killed_after_a_template_continues_with_the_rest(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bench import bench_from_scratch
    from eaglekit.cli.output import conditions

    path, columns = str(tmp_path / "ledger.json"), ["k=3 chat", "k=3 raw"]
    args = SimpleNamespace(limit=12, max_new_tokens=64)
    a, b = _drafter(tmp_path / "a", "a"), _drafter(tmp_path / "b", "b")
    drafts = {"EAGLE-3 from scratch, seed 0": a, "EAGLE-3.1 from scratch, seed 0": b}
    trained = {name: f"trained {i}" for i, name in enumerate(drafts)}
    asked: list[list[str]] = []

    def replay(stop_at=None):
        def compare(reference, paths, target, options, ks, progress=None):
            asked.append(list(paths))
            return _fake_compare([], stop_at)(reference, paths, target, options, ks, progress)

        monkeypatch.setattr(compare_module, "compare_across_k", compare)
        bench_from_scratch.replay(args, [Replay(Ledger(path, SETTINGS, columns), drafts, trained)], [3],
                                  conditions("0", "chat,raw"), str(tmp_path))

    with pytest.raises(KeyboardInterrupt):
        replay(stop_at="raw")
    held = Ledger(path, SETTINGS, columns)
    assert [s["columns"] for s in held.data["sittings"]] == [["k=3 chat"]]
    assert all(held.has(n, ["k=3 chat"]) and not held.has(n) for n in drafts)
    replay()
    held = Ledger(path, SETTINGS, columns)
    assert asked == [[a, b], [a, b], [a, b]]  # chat, raw killed, raw again: chat never twice
    assert all(held.has(n) for n in drafts) and held.data["drafters"]["EAGLE-3 from scratch, seed 0"]["trained"] == \
        "trained 0"
    replay()  # everything held: nothing replayed
    assert len(asked) == 3


def test_ledgers_of_two_budgets_share_one_replay_and_a_drafter_both_hold_is_replayed_once(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from bench import bench_from_scratch
    from eaglekit.cli.output import conditions

    columns = ["k=3 chat", "k=3 raw"]
    small, large = (Ledger(str(tmp_path / f"{n}.json"), SETTINGS | {"data_limit": n}, columns) for n in (128, 256))
    upgrade = "default upgrade (EAGLE-3.1 flags, EAGLE-3 function)"
    parts = [Replay(small, {upgrade: _drafter(tmp_path / "up-128", "upgrade"),
                            "EAGLE-3 from scratch, seed 0": _drafter(tmp_path / "x", "x")}),
             Replay(large, {upgrade: _drafter(tmp_path / "up-256", "upgrade"),
                            "EAGLE-3 from scratch, seed 0": _drafter(tmp_path / "y", "y")})]
    asked: list[list[str]] = []

    def compare(reference, paths, target, options, ks, progress=None):
        asked.append([os.path.basename(p) for p in paths])
        return _fake_compare([])(reference, paths, target, options, ks, progress)

    monkeypatch.setattr(compare_module, "compare_across_k", compare)
    bench_from_scratch.replay(SimpleNamespace(limit=12, max_new_tokens=64), parts, [3], conditions("0", "chat,raw"),
                              str(tmp_path))
    assert asked == [["up-128", "x", "y"]] * 2  # a template each; the upgrade's bytes once
    for data_limit, own in ((128, 2), (256, 3)):  # the fake draws each drafter's counters from its place, from 1
        held = Ledger(str(tmp_path / f"{data_limit}.json"), SETTINGS | {"data_limit": data_limit}, columns)
        for column in columns:
            assert held.data["drafters"][upgrade]["counters"][column] == \
                [[c.drafts, c.accepted, c.accepted_at] for c in _counters(3, 1)]
            assert held.data["drafters"]["EAGLE-3 from scratch, seed 0"]["counters"][column] == \
                [[c.drafts, c.accepted, c.accepted_at] for c in _counters(3, own)]
        assert [(s["drafters"], s["ledgers"]) for s in held.data["sittings"]] == [(3, 2)] * 2  # one sitting, shared


def test_a_study_measured_in_full_prints_every_budget_and_the_budgets_side_by_side_from_its_ledgers(tmp_path, capsys):
    from bench import bench_budget_study

    columns = ["k=3 chat", "k=3 raw"]
    names = ["default upgrade (EAGLE-3.1 flags, EAGLE-3 function)", "EAGLE-3 from scratch, seed 0",
             "EAGLE-3.1 from scratch, seed 0"]
    for offset, budget in enumerate(("25", "100")):
        data_limit, generate, code_tokens = bench_budget_study.BUDGETS[budget]
        ledger = Ledger(str(tmp_path / f"budget-study-{budget}.json"), {
            "steps": 500, "depth": 4, "lr": 0.002, "limit": 12, "max_new_tokens": 64, "data_limit": data_limit,
            "generate": generate, "code_tokens": code_tokens, "train_templates": "chat"}, columns)
        for column in columns:
            ledger.add(column, _counters(3, 0), CONVERSATIONS,
                       {n: _counters(3, 10 * offset + i) for i, n in enumerate(names)})
        ledger.save()
    bench_budget_study.main(["--work", str(tmp_path / "work"), "--ledgers", str(tmp_path), "--budgets", "25,100,25",
                             "--seeds", "0", "--k", "3", "--contexts", "0", "--templates", "chat,raw",
                             "--limit", "12"])
    out = capsys.readouterr().out
    assert "nothing to train or replay" in out and not (tmp_path / "work").exists()
    assert "| drafter − bundled EAGLE-3, 500 steps on 128 prompts × 64 tokens + 24,000 code tokens |" in out
    assert "| drafter − bundled EAGLE-3, 500 steps on 535 prompts × 128 tokens + 96,000 code tokens |" in out
    study = [line for line in out.splitlines() if line.startswith("| k=3 raw")][-1].split(" | ")[1:]
    for offset, cell in enumerate(study):
        point, interval = paired_difference(_counters(3, 10 * offset + 1), _counters(3, 10 * offset + 2),
                                            CONVERSATIONS)
        assert cell.startswith(f"{point:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}] ({point:+.3f} .. ")
    with pytest.raises(SystemExit, match="--budgets: 30 is not one of 25, 50, 100"):
        bench_budget_study.main(["--work", str(tmp_path), "--budgets", "30"])
