"""capture and `finetune --store` stream: a capture of over 200 k tokens, and 200 training steps over it, peak no
higher than the same commands on a one-shard store plus two shards and 300 MB, while the store itself is larger
than that bound (so holding it would fail).

Each run is a process of its own that reports its own peak RSS (ru_maxrss): nothing the test session holds is
counted. A tiny 4-layer target of hidden size 512 keeps the compute small and the bytes real: three aux ids in
bfloat16 and id L in float32 are 5 KB a token.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.support import REPO  # noqa: E402
from tests.support.factory import make_draft  # noqa: E402
from tests.support.targets import make_target_with_tokenizer  # noqa: E402

pytestmark = pytest.mark.model

SHARD_TOKENS = 16_384
BIG_TOKENS = 200_000
MARGIN_MB = 300
AUX = "1,2,3"
DRIVER = """import resource, sys
from eaglekit.cli.main import main
sys.argv = ["eaglekit", *sys.argv[1:]]
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
print("peak_rss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


def run_measured(*commands: list[str]) -> list[tuple[float, str]]:
    """(peak RSS in MB, stdout) of each eaglekit command, each in a process of its own on one thread; the commands
    run side by side (two cores, one thread each), which changes no process's own peak."""
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    running = [subprocess.Popen([sys.executable, "-c", DRIVER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env) for args in commands]
    measured = []
    for process in running:
        stdout, stderr = process.communicate(timeout=1200)
        assert process.returncode == 0, stderr[-3000:]
        found = re.search(r"peak_rss_kb (\d+)", stderr)
        assert found, stderr[-3000:]
        measured.append((int(found.group(1)) / 1024, stdout))
    return measured


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(target, draft, {"small": store, "big": store}, {name: capture peak MB}): one bundled prompt plus about one
    shard, or over 200 k tokens, of standard-library source."""
    base = tmp_path_factory.mktemp("store-memory")
    target = make_target_with_tokenizer(str(base / "target"), hidden=512)
    draft = make_draft(str(base / "draft"), "vllm", hidden=512, vocab=384, draft_vocab=384, aux_ids=(1, 2, 3),
                       target_layers=4)
    sizes = {"small": SHARD_TOKENS // 2, "big": BIG_TOKENS}
    paths = {name: str(base / name) for name in sizes}
    measured = run_measured(*(["capture", target, paths[name], "--data-limit", "1", "--code-tokens", str(tokens),
                               "--aux-layer-ids", AUX, "--shard-tokens", str(SHARD_TOKENS), "--store-dtype",
                               "bfloat16", "--no-progress"] for name, tokens in sizes.items()))
    return target, draft, paths, {name: peak for name, (peak, _) in zip(sizes, measured)}


def shard_sizes_mb(store: str) -> list[float]:
    with open(os.path.join(store, "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    return [os.path.getsize(os.path.join(store, s["file"])) / 2**20 for s in manifest["shards"]]


def test_a_capture_of_200k_tokens_peaks_within_two_shards_of_a_one_shard_capture(stores):
    _, _, paths, peaks = stores
    small, big = shard_sizes_mb(paths["small"]), shard_sizes_mb(paths["big"])
    assert len(small) == 1 and len(big) >= 12
    tokens = sum(s["tokens"] for s in json.load(open(os.path.join(paths["big"], "manifest.json")))["shards"])
    assert tokens >= BIG_TOKENS
    bound = 2 * max(big) + MARGIN_MB
    print(f"\ncapture peak RSS: one shard {peaks['small']:.0f} MB, {tokens:,} tokens ({sum(big):.0f} MB in "
          f"{len(big)} shards) {peaks['big']:.0f} MB; bound +{bound:.0f} MB")
    assert sum(big) > bound  # a capture that held its store would fail
    assert peaks["big"] - peaks["small"] <= bound


def test_200_steps_from_a_200k_token_store_peak_within_two_shards_of_a_one_shard_store(stores, tmp_path):
    target, draft, paths, _ = stores
    measured = run_measured(*(["finetune", draft, str(tmp_path / name), "--target", target, "--store", store,
                               "--steps", "200", "--batch-tokens", "512", "--depth", "2", "--precision", "fp32",
                               "--no-eval", "--no-progress", "--format", "json"] for name, store in paths.items()))
    peaks = {name: peak for name, (peak, _) in zip(paths, measured)}
    assert all(json.loads(out)["training"]["steps"] == 200 for _, out in measured)
    big = shard_sizes_mb(paths["big"])
    bound = 2 * max(big) + MARGIN_MB
    print(f"\nfinetune --store peak RSS: one shard {peaks['small']:.0f} MB, {sum(big):.0f} MB store "
          f"{peaks['big']:.0f} MB; bound +{bound:.0f} MB")
    assert sum(big) > bound
    assert peaks["big"] - peaks["small"] <= bound
