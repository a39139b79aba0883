"""Write docs/progress-logs.md: what each long eaglekit command prints on stderr without a terminal (a log file, CI,
a pipe), from real runs on SmolLM2-135M-Instruct with short settings (each takes a few minutes at most on a CPU).

    python scripts/progress_logs.py TARGET_FOLDER [--out docs/progress-logs.md]

The commands run in a scratch folder where the target and the bundled drafts are linked under short names, so the
logs show paths as a user types them."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Write a haiku about the sea.", "Explain what a hash table is in two sentences.",
           "List three prime numbers.", "What is the capital of France?"]
CALIBRATION_CHARS = 2500
RUNS = [
    ("upgrade with calibration", "upgrade smollm2-135m-eagle3 draft-31 --target SmolLM2-135M-Instruct "
     "--calibration-file calibration.txt"),
    ("verify", "verify draft-31 --target SmolLM2-135M-Instruct --limit 2 --max-new-tokens 16"),
    ("compare", "compare smollm2-135m-eagle3 draft-31 --target SmolLM2-135M-Instruct --limit 1 "
     "--max-new-tokens 16"),
    ("capture", "capture SmolLM2-135M-Instruct states --data train.jsonl --generate 8"),
    ("finetune", "finetune draft-31 draft-31-tuned --target SmolLM2-135M-Instruct --data train.jsonl "
     "--generate 8 --steps 4 --select-every 2 --no-eval --cache-dir finetune-cache"),
]
"""(title, arguments): each run on the one before's output where it needs one (finetune trains upgrade's)."""
ENGINE_RUNS = [
    ("bench", "bench smollm2-135m-eagle3 --target SmolLM2-135M-Instruct --concurrency 1 --limit 2 "
     "--max-new-tokens 16"),
]
"""Runs that start vLLM (its CPU build, scripts/vllm-env.sh): written when its Python is found."""


def prepare(work: Path, target: Path) -> None:
    """The scratch folder: the target and bundled drafts linked, a short calibration text and four prompts."""
    (work / "SmolLM2-135M-Instruct").symlink_to(target.resolve())
    (work / "smollm2-135m-eagle3").symlink_to(REPO / "examples" / "drafters" / "smollm2-135m-eagle3")
    text = (REPO / "eaglekit" / "data" / "calibration.txt").read_text(encoding="utf-8")
    (work / "calibration.txt").write_text(text[:CALIBRATION_CHARS], encoding="utf-8")
    (work / "train.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS),
                                      encoding="utf-8")


def engine_found() -> bool:
    """vLLM imports in the Python eaglekit would run it with (--engine-python's default lookup)."""
    from eaglekit.errors import EngineMissing
    from eaglekit.runtime.engine import EngineOptions, check_engine_available

    try:
        check_engine_available(EngineOptions())
    except EngineMissing:
        return False
    return True


def run(args: str, work: Path) -> tuple[list[str], float, int]:
    """`eaglekit ARGS` in `work` with stderr a pipe: its stderr lines, seconds taken, exit code."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "EAGLEKIT_CACHE": str(work / "cache")}  # no earlier run's states
    env.pop("EAGLEKIT_DEBUG", None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "eaglekit", *args.split()], cwd=work, env=env, text=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return proc.stderr.splitlines(), time.monotonic() - start, proc.returncode


def page(sections: list[str]) -> str:
    from eaglekit.cli.progress import ETA_AFTER_S, HEARTBEAT_S, QUIET_START_S

    body = "".join(sections)
    intro = (f"On a terminal each long command shows one transient bar on stderr. Without one (a log file, CI, a "
             f"pipe) it writes a timestamped line when each stage starts — what it does, on how much — and, while a "
             f"stage runs, a status line at least every {HEARTBEAT_S:g} s with the count done in it and the time "
             f"spent; an ETA appears only after a stage has run {ETA_AFTER_S:g} s and finished a unit. Lines of the "
             f"first {QUIET_START_S:g} s are held back and written together, so a command refused at once leaves only "
             "its one error line. `--no-progress` silences all of it; stdout (the report) is never touched.")
    settings = ("The logs below are real runs on SmolLM2-135M-Instruct (CPU, float32, a shared 2-core machine, so "
                "the counts move slowly), written by `python scripts/progress_logs.py TARGET_FOLDER`. Each command "
                "ran as `eaglekit ARGS >report.txt 2>progress.log`; its block shows the log. Short settings: a "
                f"{CALIBRATION_CHARS:,}-character calibration text, {len(PROMPTS)} training prompts answered with up "
                "to 8 tokens, 2 verify prompts and 1 compare prompt of 16 new tokens, 4 training steps without the "
                "held-out evaluation, and a `bench` of 2 prompts of 16 new tokens at concurrency 1 in vLLM's CPU build "
                "(two server starts: the target alone, then with the draft).")
    return f"# Progress without a terminal\n\n{textwrap.fill(intro, 116)}\n\n{textwrap.fill(settings, 116)}\n\n{body}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="the SmolLM2-135M-Instruct folder")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "progress-logs.md")
    opts = parser.parse_args()
    from eaglekit.cli.output import command_lines
    sections = []
    with tempfile.TemporaryDirectory(prefix="progress-logs-") as scratch:
        work = Path(scratch)
        prepare(work, opts.target)
        if not engine_found():
            sys.exit("no vLLM to run `bench` with: build its CPU environment with scripts/vllm-env.sh or set "
                     "EAGLEKIT_VLLM_PYTHON")
        for title, args in RUNS + ENGINE_RUNS:
            lines, seconds, code = run(args, work)
            if code:
                sys.exit(f"eaglekit {args} exited {code}:\n" + "\n".join(lines[-5:]))
            print(f"{title}: {len(lines)} lines in {seconds:.0f} s", file=sys.stderr)
            log = "\n".join(lines)
            shell = "\n".join(command_lines("$ ", f"eaglekit {args}", 80))
            sections.append(f"## {title}\n\n```\n{shell}\n{log}\n```\n\n({seconds:.0f} s in all.)\n\n")
    opts.out.write_text(page(sections), encoding="utf-8")


if __name__ == "__main__":
    main()
