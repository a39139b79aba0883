"""EAGLE-3.1's gain reached the way it is reached: retraining as 3.1 (`finetune --from-scratch`), against the same
retrain as EAGLE-3, over several seeds, measured where 3.1 acts.

    python bench/bench_from_scratch.py                               # 3 seeds, 300 steps, k=3, 0/1024, chat/raw
    python bench/bench_from_scratch.py --steps 500 --k 3,6 --contexts 0,1024 --limit 16 --max-new-tokens 64 \
        --work ./payoff --ledger bench/results/from-scratch-payoff.json    # the payoff (docs/benchmarks.md)
    python bench/bench_from_scratch.py --capture-engine vllm ...     # the capture through the serving engine

Both drafters start from the bundled EAGLE-3 SmolLM2 drafter: its lossless upgrade (EAGLE-3 flags) and its default
upgrade (EAGLE-3.1 flags, the function-preserving start). `finetune --from-scratch` re-initialises every trained
weight of each (keeping the vocabulary map and the target-shared embedding) and trains it with the same data,
steps, depth and seed; only the function differs. The data are finetune's own pipeline on the bundled training
prompts: the target's greedy answers, long context on every fifth prompt, standard-library source, and the
prompt templates of --train-templates in turn. They are captured once, into one store (`eaglekit capture`, in
WORK/store: a rerun with the same --work resumes it, and reuses it when complete), and every seed and function
trains from it (`finetune --store`): the capture is paid once, whatever the number of runs. A rerun with the same
--work and settings also reuses every training run that finished (WORK/runs.json) and continues a killed one
from its last checkpoint (--checkpoint-every), so the runs can be paid over several sittings. They can also be
shared between processes or machines: `--functions` and `--train-only` train a share of the runs, and a last run
over every seed (with the finished run folders and WORK/runs.json entries gathered into one --work) replays them.
The replayed counters go to a ledger (--ledger, a JSON file): a drafter in it is never trained or replayed again,
so sittings on different machines each add some seeds (`--seeds 1`), and a last run over every seed prints the
tables from the ledger alone. The bundled source is replayed in every sitting and must give the ledger's counters
prompt for prompt, else that sitting's target decoded otherwise and the ledger refuses to mix them.

Every drafter is replayed beside the bundled EAGLE-3 source on one target decode per prompt and condition, every
k on the same decode (eaglekit.decode.compare.compare_across_k); the counters go to a ledger (bench/ledger.py).
Printed: each drafter minus the source, and per seed the EAGLE-3.1 retrain minus the EAGLE-3 retrain (paired on the
same prompts), with the mean and the spread over seeds, so a gain is read against what the seed alone moves.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.ledger import Ledger, Replay, replay_by_template  # noqa: E402
from eaglekit.runner import REFERENCE, RUNNERS  # noqa: E402  (stdlib only: no model code)

SOURCE = os.path.join(REPO, "examples", "drafters", "smollm2-135m-eagle3")
FUNCTIONS = {"EAGLE-3": "eagle3", "EAGLE-3.1": "eagle31-start"}  # each retrain's start, a folder in --work
DEFAULT_UPGRADE = "default upgrade (EAGLE-3.1 flags, EAGLE-3 function)"


def parser(one_budget: bool = True) -> argparse.ArgumentParser:
    """The bench's options; a study of several data budgets (bench_budget_study.py) names its budgets in place of
    the data, the work folder and the ledger."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="SmolLM2 directory (default: .cache/smollm2, materialised if missing)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--depth", type=int, default=4, help="training-time test depth (at least the k served)")
    p.add_argument("--lr", type=float, default=2e-3, help="the bundled drafters were trained at 2e-3")
    if one_budget:
        p.add_argument("--data-limit", type=int, default=256, help="bundled training prompts")
        p.add_argument("--generate", type=int, default=64)
        p.add_argument("--code-tokens", type=int, default=48000)
    p.add_argument("--train-templates", default="chat", help="prompt templates of the training data, in turn")
    p.add_argument("--k", default="3")
    p.add_argument("--contexts", default="0,1024")
    p.add_argument("--templates", default="chat,raw")
    p.add_argument("--limit", type=int, default=8, help="held-out prompts (of the 16 bundled coding prompts)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--also", nargs="+", default=[], metavar="NAME=PATH",
                   help="more drafters measured in the same replay (e.g. an upgrade fine-tuned as it is)")
    if one_budget:
        p.add_argument("--work", help="folder for the store and the drafts (default: a temporary one)")
    p.add_argument("--capture-engine", choices=RUNNERS, default=REFERENCE,
                   help="who runs the target for the one capture (vllm: .vllm-env or $EAGLEKIT_VLLM_PYTHON)")
    p.add_argument("--store-dtype", default="bfloat16", choices=("bfloat16", "float32", "fp8"))
    p.add_argument("--functions", default="EAGLE-3,EAGLE-3.1", help="which retrains this process trains")
    p.add_argument("--train-only", action="store_true", help="stop after training (a share of the runs)")
    if one_budget:
        p.add_argument("--ledger", help="JSON file of the replayed counters, added to by each sitting "
                       "(default: WORK/ledger.json)")
    p.add_argument("--checkpoint-every", type=int, default=25,
                   help="steps between checkpoints: a run killed mid-way continues from its last one on a rerun")
    return p


class FinishedRuns:
    """The training runs a --work folder already holds (WORK/runs.json, written after each run): a rerun with the
    same settings and store reuses them, so the six 500-step runs can be paid over several sittings."""

    def __init__(self, work: str, settings: dict) -> None:
        self.path, self.settings = os.path.join(work, "runs.json"), settings

    def _read(self) -> dict:
        """Read afresh each time: another process training a share of the runs may have added its own."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return {}

    def get(self, out: str) -> str | None:
        run = self._read().get(os.path.basename(out))
        if run and run["settings"] == self.settings and os.path.isfile(os.path.join(out, "config.json")):
            return run["summary"]
        return None

    def add(self, out: str, summary: str) -> None:
        from eaglekit.cli.output import write_text_atomically

        runs = self._read() | {os.path.basename(out): {"settings": self.settings, "summary": summary}}
        write_text_atomically(self.path, json.dumps(runs, indent=1))


def prepare(args, target: str, work: str) -> tuple[dict[str, str], str]:
    """Both starts (upgrades of the bundled source) and the one store every run trains from; (starts, store)."""
    from eaglekit.capture.plan import DataOptions
    from eaglekit.capture.run import CaptureOptions, capture_store
    from eaglekit.cli.progress import ProgressLog
    from eaglekit.upgrade import UpgradeOptions, upgrade

    starts = {function: os.path.join(work, folder) for function, folder in FUNCTIONS.items()}
    upgrade(SOURCE, starts["EAGLE-3"], UpgradeOptions(target=target, fc_norm=False, norm_output=False, force=True))
    upgrade(SOURCE, starts["EAGLE-3.1"], UpgradeOptions(target=target, force=True))
    data = DataOptions(limit=args.data_limit, generate=args.generate, context_tokens=384, context_every=5,
                       code_tokens=args.code_tokens, templates=tuple(t for t in args.train_templates.split(",") if t))
    store = os.path.join(work, "store")
    t = time.perf_counter()
    with ProgressLog("bench_from_scratch") as progress:  # the data's generation and capture take minutes
        captured = capture_store(store, CaptureOptions(target=target, data=data, draft=starts["EAGLE-3"],
                                                       engine=args.capture_engine, store_dtype=args.store_dtype),
                                 progress=progress)
    print(f"store: {captured.records} sequences, {captured.tokens:,} tokens in {captured.shards} shard(s), "
          f"{captured.bytes / 2**20:.0f} MB as {args.store_dtype}, by the {args.capture_engine} engine; "
          f"{captured.captured_records} captured in {time.perf_counter() - t:.0f} s by this run", flush=True)
    return starts, store


def store_data_sha(store: str) -> str:
    """What the runs trained on: the plan, the ids, the dtype and every shard's sha256, not the versions of the
    libraries that captured it (a later sitting's capture with a newer transformers gives the same bytes)."""
    from eaglekit.capture.store import read_manifest

    manifest = read_manifest(store)
    data = [manifest.plan.to_dict(), manifest.layer_ids.to_dict(), manifest.store.to_dict(),
            [s.sha256 for s in manifest.shards]]
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def train_runs(args, names: list[tuple[int, str]], starts: dict[str, str], store: str, target: str,
               work: str) -> dict[str, tuple[str, str]]:
    """Each (seed, function)'s retrain (reused when WORK/runs.json has it); {name: (folder, what its training did)}."""
    from eaglekit.finetune.options import FinetuneOptions
    from eaglekit.finetune.run import finetune
    from eaglekit.finetune.train import TrainOptions

    finished = FinishedRuns(work, {"steps": args.steps, "depth": args.depth, "lr": args.lr,
                                   "store": store_data_sha(store)})
    drafts = {}
    for seed, function in names:
        out = os.path.join(work, f"{function.lower().replace('.', '')}-seed{seed}")
        summary = finished.get(out)
        if summary is None:
            t = time.perf_counter()
            report = finetune(starts[function], out, FinetuneOptions(
                target=target, store=store, eval=None, force=True, from_scratch=True, keep_unresolved=True,
                checkpoint_every=args.checkpoint_every, resume=os.path.isdir(f"{out}.checkpoint"),
                train=TrainOptions(steps=args.steps, depth=args.depth, lr=args.lr, seed=seed)))
            last, resumed = report.training["history"][-1], report.training["resumed_from"]
            summary = (f"{time.perf_counter() - t:.0f} s{f' after resuming at step {resumed}' if resumed else ''}, "
                       f"kept step {report.training['selected_step']}, final loss {last['loss']:.3f}, "
                       "top-1 by depth " + " ".join(f"{a:.2f}" for a in last["accuracy"]))
            finished.add(out, summary)
        print(f"{function} from scratch, seed {seed}: {summary}", flush=True)
        drafts[f"{function} from scratch, seed {seed}"] = (out, summary)
    return drafts


def replay(args, parts: list[Replay], ks: list[int], sweep: dict, target: str, name: str = "bench_from_scratch"
           ) -> None:
    """Every drafter its ledger lacks, beside the bundled source, per k and condition, into its ledger: one
    template at a time, saved after each, so a killed replay continues at the template it stopped in."""
    from eaglekit.decode.options import VerifyOptions

    print(f"held out: the first {args.limit} bundled coding prompts x {args.max_new_tokens} new tokens, float32; "
          "every drafter replayed beside the bundled EAGLE-3 source on one target decode per prompt and condition "
          "for every k, paired 95 % bootstrap over prompts", flush=True)
    grid = VerifyOptions(max_new_tokens=args.max_new_tokens, limit=args.limit, device="cpu", dtype="float32", **sweep)
    replay_by_template(parts, SOURCE, target, grid, ks, name)


@dataclass
class Budget:
    """One data budget of a study: its --work folder, its ledger, the runs this process trains and the names
    its tables print (the default upgrade, --also drafters, every retrain)."""

    args: argparse.Namespace
    work: str
    ledger: Ledger
    runs: list[tuple[int, str]]
    names: list[str]

    @property
    def measured(self) -> bool:
        return all(self.ledger.has(n) for n in self.names)


def open_budget(args, seeds: list[int], ks: list[int], sweep: dict) -> Budget:
    """The options' budget, before anything loads: its work folder, its ledger (refused if measured under other
    settings), the runs this process trains and the names its tables print."""
    from eaglekit.decode.options import VerifyOptions

    functions = [f for f in args.functions.split(",") if f]
    if unknown := set(functions) - set(FUNCTIONS):
        sys.exit(f"--functions: {', '.join(sorted(unknown))} is not one of {', '.join(FUNCTIONS)}")
    if set(functions) != set(FUNCTIONS) and not args.train_only:
        sys.exit("--functions needs --train-only: the replay pairs both retrains of every seed")
    work = args.work or tempfile.mkdtemp(prefix="bench-from-scratch-")
    columns = [f"k={k} {c.label}" for k in ks for c in VerifyOptions(**sweep).conditions]
    ledger = Ledger(args.ledger or os.path.join(work, "ledger.json"), {
        "steps": args.steps, "depth": args.depth, "lr": args.lr, "limit": args.limit,
        "max_new_tokens": args.max_new_tokens, "data_limit": args.data_limit, "generate": args.generate,
        "code_tokens": args.code_tokens, "train_templates": args.train_templates}, columns)
    runs = [(seed, f) for seed in seeds for f in FUNCTIONS if f in functions]
    names = [DEFAULT_UPGRADE, *(a.split("=", 1)[0] for a in args.also),
             *(f"{f} from scratch, seed {seed}" for seed, f in runs)]
    return Budget(args, work, ledger, runs, names)


def train_budget(budget: Budget, target: str) -> Replay:
    """The budget's store and every run its ledger lacks (reused or continued where WORK holds them); its share
    of the replay: the drafters its ledger lacks."""
    args, ledger = budget.args, budget.ledger
    os.makedirs(budget.work, exist_ok=True)
    starts, store = prepare(args, target, budget.work)
    ledger.check_store(store_data_sha(store))
    drafts = {DEFAULT_UPGRADE: starts["EAGLE-3.1"], **dict(a.split("=", 1) for a in args.also)}
    todo = [(seed, f) for seed, f in budget.runs if not ledger.has(f"{f} from scratch, seed {seed}")]
    trained = train_runs(args, todo, starts, store, target, budget.work)
    drafts.update((name, folder) for name, (folder, _) in trained.items())
    return Replay(ledger, {n: d for n, d in drafts.items() if not ledger.has(n)},
                  {name: summary for name, (_, summary) in trained.items()})


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    import torch

    from eaglekit.cli.output import conditions, int_list
    from examples.smollm2 import materialize_smollm2

    seeds, ks = int_list(args.seeds, "--seeds", "0,1,2"), int_list(args.k, "--k", "3")
    sweep = conditions(args.contexts, args.templates)
    budget = open_budget(args, seeds, ks, sweep)
    if budget.measured and not args.train_only:
        print(f"every drafter is in {budget.ledger.path}; nothing to train or replay")
        budget.ledger.print_tables(budget.names, seeds)
        return
    target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}; drafts in {budget.work}")
    part = train_budget(budget, target)
    if args.train_only:
        return
    replay(args, [part], ks, sweep, target)
    budget.ledger.print_tables(budget.names, seeds)


if __name__ == "__main__":
    main()
