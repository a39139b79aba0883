"""A replay ledger: every drafter's acceptance counters, prompt by prompt, per k and condition, beside the reference
drafter's, under the settings they were measured with. Counters are kept, not τ, so the paired interval of any two
drafters can be drawn from the file later, and a bench that writes one after each part of its grid continues a
killed run where it stopped (bench_from_scratch.py, bench_robustness.py). The docs' tables are reprinted from the
ledgers in bench/results/ by tests/project/test_docs_figures.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass

REFERENCE_LABEL = "bundled EAGLE-3"
WIDE = 8  # the most columns a table is laid out across; a wider grid is printed a row per column


class Ledger:
    """The --ledger file of one grid: settings, the reference's counters per column ("source"), the prompts'
    conversations per column, each drafter's counters per column, and the sittings that measured them."""

    def __init__(self, path: str, settings: dict, columns: list[str]) -> None:
        self.path, self.columns = path, columns
        self.data: dict = {"settings": settings | {"columns": columns}, "source": {}, "conversations": {},
                           "drafters": {}}
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as fh:
                    held = json.load(fh)
                differ = sorted(k for k, v in self.data["settings"].items() if held["settings"].get(k) != v)
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                sys.exit(f"{path}: not a ledger this bench wrote ({type(e).__name__}); give another --ledger")
            if differ:
                sys.exit(f"{path}: measured with other {', '.join(differ)} than this run; give another --ledger")
            self.data = held
        reference = self.data["settings"].get("reference")  # a grid's reference drafter, by its folder's name
        self.reference = os.path.basename(os.path.normpath(reference)) if reference else REFERENCE_LABEL

    def has(self, name: str, columns: list[str] | None = None) -> bool:
        """`name` has counters in every one of `columns` (default: the whole grid)."""
        return set(columns or self.columns) <= set(self.data["drafters"].get(name, {}).get("counters", {}))

    def check_store(self, data_sha: str) -> None:
        held = self.data["settings"].setdefault("store", data_sha)
        if held != data_sha:
            sys.exit(f"{self.path}: measured on a store of other data ({held[:12]}, this run's {data_sha[:12]}); "
                     "give another --ledger")

    def add(self, column: str, source: list, conversations: list[str], drafters: dict[str, list],
            trained: dict[str, str] | None = None) -> None:
        """One column's counters; the reference's must equal what the ledger holds (one target decode for all)."""
        encoded = _encoded(source)
        if self.data["source"].setdefault(column, encoded) != encoded or \
                self.data["conversations"].setdefault(column, conversations) != conversations:
            sys.exit(f"{self.path}: the {self.reference} reference replayed to other counters under {column} than "
                     "the ledger holds: this sitting's target decoded otherwise (hardware, threads or torch); give "
                     "another --ledger")
        for name, counters in drafters.items():
            entry = self.data["drafters"].setdefault(name, {"counters": {}})
            entry["counters"][column] = _encoded(counters)
            if trained and name in trained:
                entry["trained"] = trained[name]

    def add_sitting(self, columns: list[str], seconds: float, cpu_seconds: float, drafters: int,
                    ledgers: int = 1) -> None:
        """What measuring `columns` for `drafters` drafters cost in this sitting, with the machine's load then, so
        the grid's time is the sum of its sittings'. A sitting shared by `ledgers` ledgers (a study's budgets, the
        drafters of all of them) is recorded in each: count it once."""
        self.data.setdefault("sittings", []).append({
            "columns": columns, "drafters": drafters, "ledgers": ledgers, "seconds": round(seconds, 1),
            "cpu_seconds": round(cpu_seconds, 1),
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    def save(self) -> None:
        from eaglekit.cli.output import write_text_atomically

        write_text_atomically(self.path, json.dumps(self.data, indent=1))

    def counters(self, name: str | None, column: str):
        from eaglekit.decode.metrics import AcceptanceCounter

        held = self.data["source"][column] if name is None else self.data["drafters"][name]["counters"][column]
        k = int(column.split()[0].removeprefix("k="))
        return [AcceptanceCounter(k, drafts, accepted, list(at)) for drafts, accepted, at in held]

    def difference(self, a: str | None, b: str, column: str):
        """τ(b) − τ(a) (a None: the reference) and its paired 95 % interval over the ledger's prompts."""
        from eaglekit.decode.stats import paired_difference

        return paired_difference(self.counters(a, column), self.counters(b, column),
                                 self.data["conversations"][column])

    def tau(self, name: str | None, column: str) -> float:
        """Pooled τ of `name` (None: the reference) over the ledger's prompts in `column`."""
        from eaglekit.decode.metrics import AcceptanceCounter

        counters = self.counters(name, column)
        pooled = AcceptanceCounter(counters[0].k)
        for counter in counters:
            pooled.merge(counter)
        return pooled.acceptance_length

    @property
    def training(self) -> str:
        """What a study ledger's retrains trained: steps and data, the label that tells its tables from another
        budget's."""
        s = self.data["settings"]
        return (f"{s['steps']} steps on {s['data_limit']} prompts × {s['generate']} tokens + {s['code_tokens']:,} "
                "code tokens")

    def retrain_gain(self, seeds: list[int], column: str):
        """Each seed's EAGLE-3.1 retrain minus its EAGLE-3 retrain (paired), and their mean with the interval of the
        same prompts drawn for every seed: ([(point, interval)] per seed, (mean, interval))."""
        from eaglekit.decode.stats import mean_paired_difference

        pairs = [(f"EAGLE-3 from scratch, seed {seed}", f"EAGLE-3.1 from scratch, seed {seed}") for seed in seeds]
        per_seed = [self.difference(a, b, column) for a, b in pairs]
        mean = mean_paired_difference([(self.counters(a, column), self.counters(b, column)) for a, b in pairs],
                                      self.data["conversations"][column])
        return per_seed, mean

    def print_tables(self, names: list[str], seeds: list[int]) -> None:
        """With `seeds` (a retraining study): each drafter minus the reference, then each seed's EAGLE-3.1 retrain
        minus its EAGLE-3 retrain, a row per drafter and seed, or, for a grid wider than WIDE columns, a row per
        column. Without (a grid of conditions): a row per k and condition, with every τ and each drafter minus the
        reference."""
        if not seeds:
            self._print_condition_table(names)
            return
        print(f"\nfrom {self.path}: the training of each retrain, then the tables")
        for name in names:
            if trained := self.data["drafters"][name].get("trained"):
                print(f"{name}: {trained}")
        gains = {c: self.retrain_gain(seeds, c) for c in self.columns}
        seed_rows = {f"seed {seed}": [_cell(*gains[c][0][i]) for c in self.columns] for i, seed in enumerate(seeds)}
        if len(seeds) > 1:
            seed_rows[f"mean over {len(seeds)} seeds (min .. max)"] = [_mean_cell(*gains[c]) for c in self.columns]
        _print_grid(f"drafter − {self.reference}, {self.training}", self.columns,
                    {name: [_cell(*self.difference(None, name, c)) for c in self.columns] for name in names})
        _print_grid(f"EAGLE-3.1 retrain − EAGLE-3 retrain (same seed, paired), {self.training}", self.columns,
                    seed_rows)

    def _print_condition_table(self, names: list[str]) -> None:
        """The columns every drafter has (a grid paid over sittings is printed as far as it is measured), then
        those still to measure."""
        measured = [c for c in self.columns if all(self.has(n, [c]) for n in names)]
        prompts = {len(self.data["conversations"][c]) for c in measured}
        print(f"\nfrom {self.path}: pooled τ over {', '.join(map(str, sorted(prompts)))} prompts, and each drafter "
              "minus the reference with its paired 95 % interval")
        print(f"\n| k, condition | τ {self.reference} | " + " | ".join(f"τ {n}" for n in names) + " | "
              + " | ".join(f"{n} − {self.reference}" for n in names) + " |")
        print("|---|" + "---|" * (1 + 2 * len(names)))
        for column in measured:
            taus = [f"{self.tau(n, column):.3f}" for n in [None, *names]]
            print(f"| {column} | {' | '.join(taus)} | "
                  + " | ".join(_cell(*self.difference(None, n, column)) for n in names) + " |")
        if left := [c for c in self.columns if c not in measured]:
            print(f"\nnot measured yet: {len(left)} of {len(self.columns)} columns ({', '.join(left)})")


@dataclass
class Replay:
    """One ledger's share of a replay: its drafters (name → folder) and what trained each (name → summary)."""

    ledger: Ledger
    drafts: dict[str, str]
    trained: dict[str, str] | None = None


def replay_by_template(parts: list[Replay], reference: str, target: str, grid, ks: list[int], name: str) -> None:
    """Each template of `grid` (VerifyOptions) at every context and k, for the drafters whose counters under it
    their ledger lacks: one compare_across_k for all of them (every drafter beside `reference` on one target
    decode, a drafter held by several ledgers replayed once), so several ledgers of one grid pay the target's
    passes once. Each ledger is saved with its sitting after each template, so a killed grid continues at the
    template it stopped in. `name` labels the progress lines."""
    import dataclasses

    from eaglekit.cli.progress import ProgressLog
    from eaglekit.decode.compare import compare_across_k
    from eaglekit.errors import EaglekitError

    digests = {path: _digest(path) for part in parts for path in part.drafts.values()}
    for template in dict.fromkeys(c.template for c in grid.conditions):
        options = dataclasses.replace(grid, template=template)
        columns = [f"k={k} {c.label}" for k in ks for c in options.conditions]
        todo = {id(part): [n for n in part.drafts if not part.ledger.has(n, columns)] for part in parts}
        folders: dict[str, str] = {}  # a drafter's digest → the first folder holding it
        for part in parts:
            for n in todo[id(part)]:
                folders.setdefault(digests[part.drafts[n]], part.drafts[n])
        if not folders:
            continue
        place = {digest: i for i, digest in enumerate(folders)}  # a drafter's sweep in compare_across_k's answer
        sharing = sum(map(bool, todo.values()))
        contexts = ",".join(str(c.context_tokens) for c in options.conditions)
        print(f"measuring the {template} template: {len(folders)} drafter(s) for {sharing} "
              f"ledger(s), contexts {contexts}, k {','.join(map(str, ks))}", flush=True)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            with ProgressLog(name) as progress:  # stage lines on stderr, a heartbeat in a log
                per_k = compare_across_k(reference, list(folders.values()), target, options, ks,
                                         progress=progress)
        except EaglekitError as exc:
            sys.exit(f"error: {exc}")
        seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
        for part in parts:
            if not (names := todo[id(part)]):
                continue
            for k, sweeps in per_k.items():
                for index, condition in enumerate(options.conditions):
                    first = sweeps[0].reports[index]
                    part.ledger.add(f"k={k} {condition.label}", first.a.counters, first.conversations,
                                    {n: sweeps[place[digests[part.drafts[n]]]].reports[index].b.counters
                                     for n in names}, part.trained)
            part.ledger.add_sitting(columns, seconds, cpu_seconds, len(folders), sharing)
            part.ledger.save()
        print(f"<!-- {template}: {len(folders)} drafter(s) in {seconds:.0f} s -->", flush=True)


def _digest(path: str) -> str:
    """What a drafter folder's files hold: one drafter written into several folders (each budget's default upgrade)
    is replayed once. Anything else (a Hub id, a file, a typo) is its own name, for compare to read or refuse."""
    if not os.path.isdir(path):
        return f"path:{path}"
    digest = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if os.path.isfile(os.path.join(path, name)):
            digest.update(name.encode() + b"\0")
            with open(os.path.join(path, name), "rb") as fh:
                while block := fh.read(1 << 20):
                    digest.update(block)
    return digest.hexdigest()


def _encoded(counters) -> list:
    return [[c.drafts, c.accepted, c.accepted_at] for c in counters]


def print_study(ledgers: list[Ledger], seeds: list[int]) -> None:
    """Ledgers of one grid whose retrains trained on different budgets, side by side: per k and condition, each
    budget's mean over seeds of the EAGLE-3.1 retrain minus the EAGLE-3 retrain, with its interval over prompts
    and the seeds' range."""
    columns = ledgers[0].columns
    if differ := [ledger.path for ledger in ledgers if ledger.columns != columns]:
        sys.exit(f"{', '.join(differ)}: another grid than {ledgers[0].path}; a study compares one grid")
    print(f"\nEAGLE-3.1 retrain − EAGLE-3 retrain by training budget, mean over seeds {', '.join(map(str, seeds))}, "
          "with the interval of the mean over prompts and the seeds' range")
    _print_table(f"k, condition: EAGLE-3.1 retrain − EAGLE-3 retrain, mean over {len(seeds)} seeds",
                 [ledger.training for ledger in ledgers],
                 [[c, *(_mean_cell(*ledger.retrain_gain(seeds, c)) for ledger in ledgers)] for c in columns])


def _print_grid(title: str, columns: list[str], rows: dict[str, list[str]]) -> None:
    """A row per named row, or, for more than WIDE columns, a row per column and a column per named row."""
    if len(columns) <= WIDE:
        _print_table(title, columns, [[name, *cells] for name, cells in rows.items()])
    else:
        _print_table(f"k, condition: {title}", list(rows),
                     [[column, *(cells[i] for cells in rows.values())] for i, column in enumerate(columns)])


def _print_table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    print(f"\n| {title} | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for row in rows:
        print(f"| {' | '.join(row)} |")


def _mean_cell(per_seed: list, mean) -> str:
    points = [point for point, _ in per_seed]
    return f"{_cell(*mean)} ({min(points):+.3f} .. {max(points):+.3f})"


def _cell(point: float, interval) -> str:
    return f"{point:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]" if interval else f"{point:+.3f}"
