"""Where EAGLE-3.1 acts, by data budget: EAGLE-3 and EAGLE-3.1 retrained from scratch on three shares of the bundled
drafters' data, three seeds each, paired against the bundled EAGLE-3 source at contexts up to the target's limit.

    python bench/bench_budget_study.py --work ./study       # 3 captures, 18 runs of 500 steps, one replay: days
    python bench/bench_budget_study.py --work ./study --budgets 25 --functions EAGLE-3 --train-only   # a share

Each budget is bench_from_scratch.py's recipe on its own data: a share of the bundled drafters' 535 prompts with
128-token answers and 96,000 tokens of standard-library source (BUDGETS), with its own store and runs in
WORK/budget-NAME and its own ledger, budget-study-NAME.json in --ledgers (default: WORK). Runs continue from
checkpoints and finished runs are reused, as there, so the study is paid over sittings and processes (`--budgets`,
`--functions`, `--train-only` train a share).

The replay is one sitting for every budget: each drafter not yet in its ledger is replayed beside the source on one
target decode per prompt and condition (bench/ledger.py's replay_by_template). At 7,168 tokens of context the
target's prefill is most of the cost, so it is paid once for the study, not once per budget; the default upgrade,
the same bytes in every budget, is replayed once. Printed: each budget's tables (bench_from_scratch.py's), then per
k and condition each budget's mean over seeds of the EAGLE-3.1 retrain minus the EAGLE-3 retrain, with its interval
over prompts and the seeds' range. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import bench_from_scratch  # noqa: E402
from bench.ledger import print_study  # noqa: E402

# name → (bundled training prompts, answer tokens, source tokens): a quarter, a half (the payoff's data) and all of
# the recipe the bundled drafters were trained on (examples/train_tiny_drafter.py)
BUDGETS = {"25": (128, 64, 24000), "50": (256, 64, 48000), "100": (535, 128, 96000)}


def parse_args(argv=None) -> argparse.Namespace:
    p = bench_from_scratch.parser(one_budget=False)
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("--budgets", default=",".join(BUDGETS), help=f"which of {', '.join(BUDGETS)} (share of the data)")
    p.add_argument("--work", required=True, help="folder of every budget's store and drafts (WORK/budget-NAME)")
    p.add_argument("--ledgers", help="folder of the budgets' ledgers, budget-study-NAME.json (default: WORK)")
    p.set_defaults(steps=500, k="3,6", contexts="0,2048,4096,7168", templates="chat,system,raw", limit=16,
                   max_new_tokens=64)
    return p.parse_args(argv)


def budget_args(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """bench_from_scratch.py's options for one budget: its data, work folder and ledger."""
    data_limit, generate, code_tokens = BUDGETS[name]
    return argparse.Namespace(**{**vars(args), "data_limit": data_limit, "generate": generate,
                                 "code_tokens": code_tokens, "work": os.path.join(args.work, f"budget-{name}"),
                                 "ledger": os.path.join(args.ledgers or args.work, f"budget-study-{name}.json")})


def main(argv=None) -> None:
    args = parse_args(argv)
    from eaglekit.cli.output import conditions, int_list

    names = list(dict.fromkeys(n for n in args.budgets.split(",") if n))
    if unknown := [n for n in names if n not in BUDGETS]:
        sys.exit(f"--budgets: {', '.join(unknown)} is not one of {', '.join(BUDGETS)}")
    if not names:
        sys.exit(f"--budgets: name at least one of {', '.join(BUDGETS)}")
    os.makedirs(args.ledgers or args.work, exist_ok=True)  # before hours of training, not after
    seeds, ks = int_list(args.seeds, "--seeds", "0,1,2"), int_list(args.k, "--k", "3")
    sweep = conditions(args.contexts, args.templates)
    budgets = [bench_from_scratch.open_budget(budget_args(args, n), seeds, ks, sweep) for n in names]
    if all(b.measured for b in budgets) and not args.train_only:
        print(f"every drafter of every budget is in its ledger ({', '.join(b.ledger.path for b in budgets)}); "
              "nothing to train or replay")
    else:
        import torch

        from examples.smollm2 import materialize_smollm2

        target = args.target or materialize_smollm2(os.path.join(REPO, ".cache", "smollm2"))
        print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
              f"torch {torch.__version__}; budgets {', '.join(names)} in {args.work}", flush=True)
        parts = [bench_from_scratch.train_budget(b, target) for b in budgets]
        if args.train_only:
            return
        bench_from_scratch.replay(args, parts, ks, sweep, target, "bench_budget_study")
    for budget in budgets:
        budget.ledger.print_tables(budget.names, seeds)
    print_study([b.ledger for b in budgets], seeds)


if __name__ == "__main__":
    main()
