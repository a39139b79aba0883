"""Hostile and careless targets and prompts: a target is read through the checked safetensors reader and must
hold every tensor its config builds, only architectures eaglekit can hook are loaded (in one line, nothing of
transformers' own output), its geometry is range-checked, and prompts are bounded by its context.

Small targets are real Llama checkpoints written tensor by tensor (zeros: loading, not quality, is under test);
the real SmolLM2 target is copied with its weights hard-linked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from eaglekit.decode.prompts import Prompt, PromptTokens, encode, longest_token_chars, read_prompts  # noqa: E402
from eaglekit.errors import CheckpointError  # noqa: E402
from eaglekit.target import GEOMETRY_LIMITS, SIZES_WHERE_WRITTEN, read_target  # noqa: E402
from eaglekit.target_model import load_target  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.cli import run_cli  # noqa: E402
from tests.support.factory import edit_config, make_draft, make_target_config, rewrite_tensors, write_safetensors  # noqa: E402
from tests.support.hostile import bounded, clean, refused  # noqa: E402
from tests.support.smollm2 import smollm2_path  # noqa: E402

pytestmark = pytest.mark.model

FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
HIDDEN, VOCAB, HEADS, KV_HEADS, INTERMEDIATE = 64, 256, 4, 2, 128
ROOT = str(REPO)


def llama_tensors(layers: int, tied: bool) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a Llama of make_target_config's geometry stores."""
    kv = HIDDEN // HEADS * KV_HEADS
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "model.norm.weight": (HIDDEN,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
                       p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": (kv, HIDDEN),
                       p + "self_attn.v_proj.weight": (kv, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
                       p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
                       p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
                       p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE)})
    if not tied:
        shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    return shapes


def write_target(path: str, shapes: dict[str, tuple[int, ...]], *, layers: int, tied: bool, shards: int = 1,
                 max_position_embeddings: int = 256) -> str:
    """A Llama target folder: config.json and the tensors `shapes` names (zeros, BF16), in `shards` files."""
    make_target_config(path, layers=layers, hidden=HIDDEN, vocab=VOCAB, tied=tied)
    edit_config(path, lambda c: c.update(max_position_embeddings=max_position_embeddings))
    tensors = {name: ("BF16", shape, bytes(2 * int(torch.Size(shape).numel()))) for name, shape in shapes.items()}
    names = list(tensors)
    if shards == 1:
        write_safetensors(os.path.join(path, "model.safetensors"), tensors)
        return path
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(path, file), {n: tensors[n] for n in names[s::shards]})
        weight_map.update({n: file for n in names[s::shards]})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)
    return path


def draft_for(path: str, layers: int) -> str:
    return make_draft(path, "vllm", hidden=HIDDEN, vocab=VOCAB, draft_vocab=128, target_layers=layers,
                      aux_ids=(0, 1, layers))


def loaded(*args: str, code: int = 1, contains: str = ""):
    """refused() for commands that may load a target: the same one-line contract, a bound for loading."""
    with bounded(120):
        return refused(*args, code=code, contains=contains)


def copy_smollm2(path: str) -> str:
    """SmolLM2 with its own files hard-linked (the weights are not copied), so a test may edit config.json."""
    source = smollm2_path()
    os.makedirs(path)
    for name in os.listdir(source):
        if name == "config.json":
            shutil.copy(os.path.join(source, name), os.path.join(path, name))
        else:
            os.link(os.path.join(source, name), os.path.join(path, name))
    return path


# ------------------------------------------------------------------ weights that do not cover the config

HOLES = st.sampled_from(["layer", "lm_head", "norm", "embed", "extra layer", "q_proj everywhere", "shape"])


@FEW
@given(layers=st.integers(2, 4), tied=st.booleans(), hole=HOLES, which=st.integers(0, 3), shards=st.integers(1, 3))
def test_weights_missing_what_the_config_builds_are_refused_before_anything_runs(tmp_path_factory, layers, tied,
                                                                                 hole, which, shards):
    shapes = llama_tensors(layers, tied)
    layer = which % layers
    if hole == "layer":
        shapes = {n: s for n, s in shapes.items() if not n.startswith(f"model.layers.{layer}.")}
    elif hole == "lm_head":
        tied = False
        shapes.pop("lm_head.weight", None)
    elif hole == "norm":
        del shapes["model.norm.weight"]
    elif hole == "embed":
        del shapes["model.embed_tokens.weight"]
    elif hole == "extra layer":
        shapes[f"model.layers.{layers + which}.input_layernorm.weight"] = (HIDDEN,)
    elif hole == "q_proj everywhere":
        shapes = {n: s for n, s in shapes.items() if "q_proj" not in n}
    else:
        shapes[f"model.layers.{layer}.mlp.up_proj.weight"] = (INTERMEDIATE * 2, HIDDEN)
    root = tmp_path_factory.mktemp("t")
    target = write_target(str(root / "target"), shapes, layers=layers, tied=tied, shards=shards)
    draft = draft_for(str(root / "draft"), layers)
    # every command that loads the target refuses it in one line: verify, compare and finetune name the folder
    expected = {"layer": f"missing layer {layer}", "lm_head": "lm_head.weight", "norm": "final norm",
                "embed": "embed_tokens", "extra layer": f"layer {layers + which}", "q_proj everywhere": "q_proj",
                "shape": "up_proj"}[hole]
    for command in (["verify", draft], ["compare", draft, draft]):
        loaded(*command, "--target", target, "--no-progress", contains=expected)
    with pytest.raises(CheckpointError, match=expected):
        load_target(target)
    # a complete copy of the same target loads
    complete = write_target(str(root / "complete"), llama_tensors(layers, tied), layers=layers, tied=tied,
                            shards=shards)
    assert load_target(complete).num_layers == layers


def test_the_real_target_with_a_layer_or_its_head_missing_is_refused(tmp_path):
    more_layers = edit_config(copy_smollm2(str(tmp_path / "31")), lambda c: c.update(num_hidden_layers=31))
    draft = os.path.join(ROOT, "examples", "drafters", "smollm2-135m-eagle3")
    loaded("verify", draft, "--target", more_layers, contains="cover 30 of the 31 layers declared (missing layer 30)")
    untied = edit_config(copy_smollm2(str(tmp_path / "untied")), lambda c: c.update(tie_word_embeddings=False))
    loaded("verify", draft, "--target", untied, contains="no lm_head.weight")
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_target(untied)


# ------------------------------------------------------------------ truncated and inconsistent weight files


@FEW
@given(cut=st.integers(1, 10**6), shards=st.integers(1, 3), victim=st.integers(0, 2))
def test_truncated_weights_are_one_line_naming_the_file(tmp_path_factory, cut, shards, victim):
    root = tmp_path_factory.mktemp("t")
    target = write_target(str(root / "target"), llama_tensors(2, False), layers=2, tied=False, shards=shards)
    files = sorted(n for n in os.listdir(target) if n.endswith(".safetensors"))
    file = os.path.join(target, files[victim % len(files)])
    os.truncate(file, max(0, os.path.getsize(file) - cut))
    result = loaded("verify", draft_for(str(root / "draft"), 2), "--target", target, "--no-progress")
    assert result.stderr.startswith(f"Error: {file}: "), result.stderr
    clean("validate", draft_for(str(root / "d2"), 2), "--target", target, codes=(1,))


def test_an_index_that_does_not_match_its_shards_is_refused(tmp_path):
    target = write_target(str(tmp_path / "target"), llama_tensors(2, False), layers=2, tied=False, shards=2)
    index = os.path.join(target, "model.safetensors.index.json")
    doc = json.load(open(index))
    doc["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors" if doc["weight_map"][
        "model.norm.weight"].startswith("model-00001") else "model-00001-of-00002.safetensors"
    json.dump(doc, open(index, "w"))
    loaded("verify", draft_for(str(tmp_path / "draft"), 2), "--target", target, contains="does not hold it")


# ------------------------------------------------------------------ architectures eaglekit does not run

OTHER_ARCHITECTURES = st.sampled_from(["gpt2", "bert", "t5", "whisper", "mamba", "no-such-model", "clip"])


@FEW
@given(model_type=OTHER_ARCHITECTURES)
def test_another_architecture_is_refused_in_one_line_naming_it(tmp_path_factory, model_type):
    root = tmp_path_factory.mktemp("t")
    target = write_target(str(root / "target"), llama_tensors(2, True), layers=2, tied=True)
    edit_config(target, lambda c: c.update(model_type=model_type, architectures=["SomethingElse"]))
    result = loaded("verify", draft_for(str(root / "draft"), 2), "--target", target, "--no-progress",
                    contains=model_type)
    assert "eaglekit loads decoder-only causal LMs" in result.stderr


@pytest.mark.parametrize("model_type, hole", [("bert", None), ("llama", "q_proj")])
def test_transformers_prints_nothing_of_its_own(tmp_path, model_type, hole):
    """In a fresh process, as a user runs it: stderr is the one error line, stdout is empty."""
    shapes = {n: s for n, s in llama_tensors(2, True).items() if hole is None or hole not in n}
    target = write_target(str(tmp_path / "target"), shapes, layers=2, tied=True)
    edit_config(target, lambda c: c.update(model_type=model_type))
    draft = draft_for(str(tmp_path / "draft"), 2)
    env = {**os.environ, "PYTHONPATH": ROOT, "EAGLEKIT_DEBUG": "", "TRANSFORMERS_VERBOSITY": "info"}
    proc = subprocess.run([sys.executable, "-m", "eaglekit", "verify", draft, "--target", target, "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(f"Error: {target}: "), proc.stderr


# ------------------------------------------------------------------ absurd geometry in the target config

GEOMETRY = st.sampled_from(sorted(GEOMETRY_LIMITS))
VALUES = (st.integers(-2**70, 2**70) | st.sampled_from([0, -1, 2**62, 2**31, 1 << 30]) | st.floats()
          | st.booleans() | st.text(max_size=4) | st.none())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=GEOMETRY, value=VALUES)
def test_target_geometry_is_typed_and_range_checked(tmp_path_factory, key, value):
    root = tmp_path_factory.mktemp("t")
    target = edit_config(make_target_config(str(root / "t")), lambda c: c.update({key: value}))
    valid = type(value) is int and 1 <= value <= GEOMETRY_LIMITS[key]
    absent_is_fine = value is None and key in ("max_position_embeddings", *SIZES_WHERE_WRITTEN)
    draft = make_draft(str(root / "d"), "vllm")
    if valid or absent_is_fine:
        result = clean("validate", draft, "--target", target)
        assert key not in result.stderr
        assert read_target(target).num_layers >= 1
    else:
        refused("validate", draft, "--target", target, contains=key)
        with pytest.raises(CheckpointError, match=key):
            read_target(target)


def test_a_gguf_target_whose_tensors_do_not_cover_its_blocks_is_refused(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from eaglekit.io.gguf import GgufField, GgufTensor, write_gguf

    def target(path, blocks: int, block_count: int) -> str:
        fields = [GgufField("general.architecture", "llama", gguf.GGUFValueType.STRING),
                  GgufField("llama.block_count", block_count, gguf.GGUFValueType.UINT32),
                  GgufField("llama.embedding_length", HIDDEN, gguf.GGUFValueType.UINT32),
                  GgufField("llama.vocab_size", VOCAB, gguf.GGUFValueType.UINT32)]
        names = [("token_embd.weight", (VOCAB, HIDDEN)), ("output_norm.weight", (HIDDEN,))]
        names += [(f"blk.{i}.attn_norm.weight", (HIDDEN,)) for i in range(blocks)]
        tensors = [GgufTensor(n, s, "F32", lambda s=s: np.zeros(s, np.float32)) for n, s in names]
        write_gguf(str(path), "llama", fields, tensors)
        return str(path)

    assert read_target(target(tmp_path / "ok.gguf", 3, 3)).num_layers == 3
    with pytest.raises(CheckpointError, match=r"cover 2 of the 3 layers"):
        read_target(target(tmp_path / "short.gguf", 2, 3))
    with pytest.raises(CheckpointError, match="block_count must be a positive integer at most"):
        read_target(target(tmp_path / "huge.gguf", 2, 2**31))


# ------------------------------------------------------------------ prompts against the target's context


class CountingTokenizer:
    """The real tokenizer, recording the longest text it was asked to encode."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.longest = 0

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __call__(self, text, **kwargs):
        self.longest = max(self.longest, len(text))
        return self._tokenizer(text, **kwargs)

    def apply_chat_template(self, messages, **kwargs):
        self.longest = max(self.longest, sum(len(m["content"]) for m in messages))
        return self._tokenizer.apply_chat_template(messages, **kwargs)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(smollm2_path())


@FEW
@given(context=st.integers(32, 600), words=st.integers(1, 800), template=st.sampled_from(["chat", "raw"]),
       huge=st.booleans())
def test_prompts_are_bounded_by_the_context_before_the_tokenizer_sees_them(smollm2_tokenizer, context, words,
                                                                          template, huge):
    text = "x" * (5_000_000 if huge else 0) + " word" * words
    prompt = Prompt("p", ({"role": "user", "content": text},), None, file="prompts.jsonl", record="line 7")
    smollm2_tokenizer.model_max_length = 10**30  # transformers' "unknown": nothing is bounded
    tokens = None if huge else len(encode(prompt, smollm2_tokenizer, template=template))
    smollm2_tokenizer.model_max_length = context  # as load_target sets it from max_position_embeddings
    tokenizer = CountingTokenizer(smollm2_tokenizer)
    with bounded(20):
        try:
            ids = encode(prompt, tokenizer, template=template)
        except CheckpointError as exc:
            assert tokens is None or tokens > context, (tokens, context)
            assert str(exc).startswith("prompts.jsonl: line 7: ") and f"{context:,}-token context" in str(exc)
        else:
            assert len(ids) == tokens <= context and ids.prompt.record == "line 7"
        cut = encode(prompt, tokenizer, template=template, max_tokens=context)  # training cuts instead
    assert len(cut) == min(context, tokens or context)
    assert tokenizer.longest <= context * longest_token_chars(smollm2_tokenizer)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A loadable Llama with a 256-token context and SmolLM2's tokenizer, and a draft for it."""
    from tests.support.targets import make_tiny_target

    base = tmp_path_factory.mktemp("tiny")
    target = make_tiny_target(base / "target", layers=2, vocab=49152, tokenizer_from=smollm2_path())
    draft = make_draft(str(base / "draft"), "vllm", hidden=64, vocab=49152, draft_vocab=128, target_layers=2,
                       aux_ids=(0, 1, 2))
    return target, draft


@FEW
@given(words=st.integers(150, 4000), new=st.integers(1, 64), line=st.integers(1, 3))
def test_verify_refuses_a_prompt_past_the_context_naming_its_line(tmp_path_factory, tiny, words, new, line):
    target, draft = tiny
    path = str(tmp_path_factory.mktemp("p") / "prompts.jsonl")
    with open(path, "w") as fh:  # blank lines put the record on `line` without a decode before it
        fh.write("\n" * (line - 1) + json.dumps({"prompt": "word " * words}) + "\n")
    unbounded = load_target(target).tokenizer
    unbounded.model_max_length = 10**30
    tokens = len(encode(read_prompts(path).prompts[0], unbounded)) if words < 256 else None
    args = ["verify", draft, "--target", target, "--prompts", path, "--max-new-tokens", str(new), "--no-progress",
            "-k", "2", "--format", "json"]
    if tokens is not None and tokens + new <= 256:
        with bounded(120):
            assert run_cli(args).exit_code == 0
    else:
        result = loaded(*args, contains=f"Error: {path}: line {line}: ")
        assert "256-token context" in result.stderr
        if tokens is not None and tokens <= 256:
            assert f"{256 - tokens} new tokens fit" in result.stderr


def test_a_50_mb_prompt_line_is_refused_in_bounded_time(tmp_path, tiny):
    target, draft = tiny
    path = str(tmp_path / "prompts.jsonl")
    with open(path, "w") as fh:
        fh.write(json.dumps({"prompt": "Say hi."}) + "\n" + json.dumps({"prompt": "x" * 50_000_000}) + "\n")
    with bounded(60):
        refused("verify", draft, "--target", target, "--prompts", path, "--no-progress", "--max-new-tokens", "4",
                contains=f"Error: {path}: line 2: 50,000,000 characters cannot fit the target's 256-token context")


def test_finetune_data_is_cut_at_the_context_and_says_which_records(tmp_path, tiny, monkeypatch):
    import eaglekit.target_model
    from eaglekit.capture.plan import DataOptions
    from eaglekit.finetune.data import captured_data
    from eaglekit.finetune.options import FinetuneOptions
    from eaglekit.target import read_target

    target, _ = tiny
    counted = []
    load_tokenizer = eaglekit.target_model.load_tokenizer
    monkeypatch.setattr(eaglekit.target_model, "load_tokenizer",
                        lambda *a, **kw: counted.append(CountingTokenizer(load_tokenizer(*a, **kw))) or counted[-1])
    path = str(tmp_path / "data.jsonl")
    with open(path, "w") as fh:
        fh.write(json.dumps({"prompt": "Say hi."}) + "\n" + json.dumps({"prompt": "x " * 3_000_000}) + "\n")
    opts = FinetuneOptions(target=target, data=DataOptions(data_file=path, max_length=4096),
                           cache_dir=str(tmp_path / "cache"))
    data = captured_data(read_target(target), (0, 1, 2), opts, "cpu")
    lengths = (data.offsets[1:] - data.offsets[:-1]).tolist()
    assert lengths[1] == 256 and lengths[0] < 256
    assert any("1 record(s)" in note and "line 2" in note and "256-token context" in note for note in data.notes)
    assert counted and all(t.longest <= 256 * longest_token_chars(t) for t in counted)


@FEW
@given(tokens=st.integers(1, 3000), new=st.integers(1, 300), k=st.integers(1, 8))
def test_the_vllm_engine_is_not_started_for_a_prompt_past_its_max_model_len(smollm2_tokenizer, tokens, new, k):
    from eaglekit.errors import UsageError
    from eaglekit.runtime.engine import EngineOptions, run_vllm

    prompt = Prompt("p", ({"role": "user", "content": "x"},), None, file="speed.jsonl", record="question_id 'q7'")
    ids = PromptTokens([1] * tokens, prompt)
    engine = EngineOptions(python="/no/such/python", timeout_s=1)  # starting vLLM fails differently (OSError)
    with pytest.raises((UsageError, OSError)) as raised:
        run_vllm("draft", "target", [ids], k=k, max_new_tokens=new, dtype="float32", opts=engine, context=2048)
    if tokens + new + k > 2048:  # max_model_len is fitted to the prompts, within the target's context
        assert isinstance(raised.value, UsageError)
        message = str(raised.value)
        assert message.startswith("speed.jsonl: question_id 'q7': ") and "2,048-token context" in message
    else:
        assert "max_model_len" not in str(raised.value)


@pytest.mark.parametrize("command", ["verify", "compare"])
def test_every_first_turn_is_checked_before_the_first_decode(tmp_path, tiny, monkeypatch, command):
    """A prompt too long for the context after a good one is refused before anything is decoded."""
    import eaglekit.decode.setup as setup
    import eaglekit.verify.run as run

    def no_decode(*args, **kwargs):
        raise AssertionError("a decode ran before every prompt was checked")

    monkeypatch.setattr(run, "greedy_decode", no_decode)  # verify's warm-up
    monkeypatch.setattr(setup, "greedy_decode", no_decode)  # every prompt turn
    target, draft = tiny
    path = str(tmp_path / "prompts.jsonl")
    with open(path, "w") as fh:
        fh.write(json.dumps({"prompt": "Say hi."}) + "\n" + json.dumps({"prompt": "Say hi. " * 40}) + "\n")
    drafts = [draft, draft] if command == "compare" else [draft]
    loaded(command, *drafts, "--target", target, "--prompts", path, "--no-progress", "--max-new-tokens", "200",
           contains=f"Error: {path}: line 2: ")


def test_verify_in_the_engine_bounds_prompts_by_the_target_context_before_the_tokenizer(tmp_path, tiny, monkeypatch):
    """--engine vllm loads only the tokenizer, which carries the target's context like the reference path."""
    import eaglekit.verify.run as run

    monkeypatch.setattr(run, "check_engine_available", lambda opts, progress=None: "0.32.0")
    monkeypatch.setattr(run, "run_vllm", lambda *a, **kw: pytest.fail("the engine started"))
    target, draft = tiny
    path = str(tmp_path / "prompts.jsonl")
    with open(path, "w") as fh:
        fh.write(json.dumps({"prompt": "Say hi."}) + "\n" + json.dumps({"prompt": "x" * 5_000_000}) + "\n")
    with bounded(30):
        refused("verify", draft, "--target", target, "--engine", "vllm", "--prompts", path, "--no-progress",
                contains=f"Error: {path}: line 2: 5,000,000 characters cannot fit the target's 256-token context")


@settings(max_examples=8, deadline=None)
@given(shift=st.integers(0, 3), char=st.sampled_from(["é", "€", "𝄞", "a"]))
def test_a_calibration_file_is_read_up_to_a_bound_and_never_blocks(tmp_path_factory, shift, char):
    """A file past the bound is used for its start (a character the bound cuts is dropped, never half-decoded);
    a FIFO is refused at once; bytes that are not UTF-8 are one line."""
    from eaglekit.capture.plan import CALIBRATION_READ_BYTES, calibration_text
    from eaglekit.errors import EaglekitError

    folder = tmp_path_factory.mktemp("cal")
    big = folder / "big.txt"
    head = "a" * (CALIBRATION_READ_BYTES - shift)
    big.write_text(head + char * 8 + "tail", encoding="utf-8")
    text, where = calibration_text(str(big))
    assert where == str(big) and text.startswith(head) and len(text.encode("utf-8")) <= CALIBRATION_READ_BYTES
    assert set(text[len(head):]) <= {char}
    fifo = folder / "fifo"
    os.mkfifo(fifo)
    with bounded(5), pytest.raises(EaglekitError, match="FIFO"):
        calibration_text(str(fifo))
    bad = folder / "bad.txt"
    bad.write_bytes(b"ok \xff\xfe")
    with pytest.raises(EaglekitError, match="not UTF-8"):
        calibration_text(str(bad))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(context=st.integers(192, 100_000), new=st.integers(64, 128))
def test_a_context_setting_past_the_target_names_the_option_not_a_prompt(tiny, context, new):
    """The tiny target holds 256 tokens: every setting here leaves no room, and the option is named."""
    target, draft = tiny
    result = loaded("verify", draft, "--target", target, "--no-progress", "--limit", "1", "--max-new-tokens", str(new),
                    "--context-tokens", str(context), code=2, contains=f"--context-tokens {context:,}")
    assert "256-token context" in result.stderr and "prompts" not in result.stderr


# ------------------------------------------------------------------ weights a target cannot run with

TORCH_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
INTEGER_SIZES = {"I8": 1, "U8": 1, "BOOL": 1, "I16": 2, "I32": 4, "I64": 8}


def poisoned(dtype: str, shape: tuple[int, ...], at: int, value: float) -> tuple[str, tuple[int, ...], bytes]:
    """A zero tensor of `dtype` with `value` at flat index `at`, as safetensors stores it."""
    tensor = torch.zeros(shape, dtype=TORCH_FLOATS[dtype]).flatten()
    tensor[at % tensor.numel()] = value
    return dtype, shape, tensor.view(torch.uint8).numpy().tobytes()


@FEW
@given(victim=st.sampled_from(sorted(llama_tensors(2, tied=False))), value=st.sampled_from([float("nan"),
       float("inf"), float("-inf")]), at=st.integers(0, 10**6), dtype=st.sampled_from(sorted(TORCH_FLOATS)),
       load_as=st.sampled_from(["float32", "bfloat16"]))
def test_a_target_weight_holding_nan_or_inf_is_refused_naming_it(tmp_path_factory, victim, value, at, dtype, load_as):
    """One non-finite value anywhere in any weight, in any float dtype, loaded in any dtype: refused after loading,
    naming the tensor, before any decode; the same target without it loads."""
    path = write_target(str(tmp_path_factory.mktemp("nan")), llama_tensors(2, tied=False), layers=2, tied=False)
    rewrite_tensors(path, lambda ts: {**ts, victim: poisoned(dtype, ts[victim][1], at, value)})
    with pytest.raises(CheckpointError, match=f"target weight {victim} holds NaN or infinite values"):
        load_target(path, dtype=load_as)
    rewrite_tensors(path, lambda ts: {**ts, victim: poisoned(dtype, ts[victim][1], at, 1.0)})
    assert load_target(path, dtype=load_as).path == path


@FEW
@given(victim=st.sampled_from(sorted(llama_tensors(2, tied=False))), dtype=st.sampled_from(sorted(INTEGER_SIZES)),
       quantized=st.booleans())
def test_an_integer_target_weight_without_a_quantization_config_is_refused_before_loading(tmp_path_factory, victim,
                                                                                          dtype, quantized):
    """A tensor the config builds as floating point, stored as an integer or bool: refused from the header alone,
    naming it; a quantization_config says how to read it, and the check leaves it to the loader."""
    path = write_target(str(tmp_path_factory.mktemp("int")), llama_tensors(2, tied=False), layers=2, tied=False)
    rewrite_tensors(path, lambda ts: {**ts, victim: (dtype, ts[victim][1],
                                                     bytes(INTEGER_SIZES[dtype] * len(ts[victim][2]) // 2))})
    if quantized:
        edit_config(path, lambda c: c.update(quantization_config={"quant_method": "bitsandbytes"}))
        read_target(path, weights=True)
        return
    with pytest.raises(CheckpointError, match=f"{victim} is {dtype}, not floating point"):
        read_target(path, weights=True)


@pytest.mark.parametrize("command", ["verify", "compare", "finetune"])
def test_commands_refuse_a_target_with_nan_or_integer_weights(tmp_path, tiny, command):
    """Through the CLI: the final norm holding a NaN, or stored as I32, is one line naming it, and nothing runs."""
    target, draft = tiny
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Count to three."}) + "\n")
    args = {"verify": ["verify", draft, "--prompts", str(prompts), "--limit", "1", "--no-progress"],
            "compare": ["compare", draft, draft, "--prompts", str(prompts), "--limit", "1", "--no-progress"],
            "finetune": ["finetune", draft, str(tmp_path / "out"), "--data", str(prompts), "--cache-dir",
                         str(tmp_path / "cache"), "--steps", "1", "--no-eval", "--no-progress"]}[command]
    for name, edit in (("nan", lambda ts: {**ts, "model.norm.weight": poisoned("F32", ts["model.norm.weight"][1], 3,
                                                                                  float("nan"))}),
                       ("i32", lambda ts: {**ts, "model.norm.weight": ("I32", ts["model.norm.weight"][1],
                                                                        ts["model.norm.weight"][2])})):
        bad = str(tmp_path / name)
        shutil.copytree(target, bad)
        first = rewrite_tensors(bad, edit)
        line = loaded(*args, "--target", first, contains="model.norm.weight").stderr
        assert ("NaN" in line) == (name == "nan") and ("I32" in line) == (name == "i32"), line
    assert not os.path.exists(tmp_path / "out")
